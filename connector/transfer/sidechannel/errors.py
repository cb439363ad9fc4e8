"""The side channel's one error: a peer that did not answer in time, answered garbage, or refused."""

from __future__ import annotations

__all__ = ["SideChannelError"]


class SideChannelError(RuntimeError):
    """The peer did not answer in time, answered garbage, or refused the request."""
