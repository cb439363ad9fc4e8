"""operator/local."""
