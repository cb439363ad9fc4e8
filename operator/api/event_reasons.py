"""Every reason the operator posts Events with, declared once (`kubectl get events` shows them;
alerts and runbooks match on them, so a rename is an API change)."""

from __future__ import annotations

# An Event's type: Kubernetes knows these two.
NORMAL = "Normal"
WARNING = "Warning"

# The fleet's spec and its children (reconcile/reconciler.py)
INVALID_SPEC = "InvalidSpec"  # Warning: the spec was refused; the reason is in status too
NOT_OWNED = "NotOwned"  # Warning: a child's name is taken by an object the fleet does not own
CREATED = "Created"
UPDATED = "Updated"
DELETED = "Deleted"
APPLY_FAILED = "ApplyFailed"  # Warning

# Rollouts (reconcile/reconciler.py, reconcile/canary.py)
ROLLOUT_STARTED = "RolloutStarted"
ROLLOUT_SWITCHED = "RolloutSwitched"
CANARY_STARTED = "CanaryStarted"
CANARY_STEP_ADVANCED = "CanaryStepAdvanced"
CANARY_PROMOTED = "CanaryPromoted"
CANARY_ABORTED = "CanaryAborted"  # Warning

# Scaling (autoscale/edge.py, autoscale/planner_edge.py)
SCALING_CLAMPED = "ScalingClamped"  # Warning
SCALING_WITHIN_BOUNDS = "ScalingWithinBounds"
PLANNER_SCALED = "PlannerScaled"
PLANNER_CONFLICT = "PlannerConflict"  # Warning
