"""connector/adapter."""
