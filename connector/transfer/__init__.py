"""connector/transfer."""
