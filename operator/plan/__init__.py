"""operator/plan."""
