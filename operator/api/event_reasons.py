"""Every reason the operator posts Events with, declared once (`kubectl get events` shows them;
alerts and runbooks match on them, so a rename is an API change)."""

from __future__ import annotations

from pdfleet.operator.api import conditions

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

# Why pods are not ready and what the fleet waits for (Warnings, one per new cause; the same words as
# the Ready condition's reasons in api/conditions.py)
UNSCHEDULABLE = conditions.UNSCHEDULABLE
IMAGE_PULL_BACK_OFF = conditions.IMAGE_PULL_BACK_OFF
CREATE_CONTAINER_CONFIG_ERROR = conditions.CREATE_CONTAINER_CONFIG_ERROR
CRASH_LOOP_BACK_OFF = conditions.CRASH_LOOP_BACK_OFF
SECRET_MISSING = conditions.SECRET_MISSING
PROGRESS_DEADLINE_EXCEEDED = conditions.PROGRESS_DEADLINE_EXCEEDED

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
# Scale to zero as a pair (autoscale/scale_to_zero_edge.py): both scalers 0 -> 1, both -> 0, a half pair completed
PAIR_ACTIVATED = "PairActivated"
PAIR_RETIRED = "PairRetired"
PAIR_COMPLETED = "PairCompleted"
