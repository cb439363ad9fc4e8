"""The client's socket pool policy (pure): which socket goes when the pool is full."""

from __future__ import annotations

__all__ = ["pool_victim"]


def pool_victim(entries: list[tuple[object, bool, bool]]) -> object:
    """Which socket to close when the pool is full. ``entries`` are (endpoint, busy, has answered)
    in least recently used order: an idle one first, else one that never answered (an endpoint
    that does not reply must not push out a healthy prefill), else the least recently used."""
    for ep, busy, _ in entries:
        if not busy:
            return ep
    for ep, _, answered in entries:
        if not answered:
            return ep
    return entries[0][0]
