"""Rollout decisions (pure): the canary's step, analysis and abort logic (issue 22)."""
