"""Per-role autoscaling: clamping scaler replicas (pure), the SLO planner (pure), and their edges."""
