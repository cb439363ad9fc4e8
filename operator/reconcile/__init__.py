"""operator/reconcile."""
