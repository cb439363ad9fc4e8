"""Rollout decisions (pure): the paired rollout (which revision serves, which stay) and the canary's step,
analysis and abort logic (issue 22)."""
