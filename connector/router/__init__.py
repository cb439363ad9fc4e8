"""connector/router."""
