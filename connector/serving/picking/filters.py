"""The filters of a pick (pure; see chain.py)."""

from __future__ import annotations

from collections.abc import Sequence

from pdfleet.connector.serving.picking.chain import PickState


def not_tried(candidates: Sequence[str], state: PickState) -> Sequence[str]:
    """A retried leg never goes back to an endpoint this request already tried."""
    tried = state.tried
    return [c for c in candidates if c not in tried] if tried else candidates


def healthy_first(candidates: Sequence[str], state: PickState) -> Sequence[str]:
    """Endpoints that failed lately are taken only when nothing else is left."""
    ejected = state.ejected
    return ([c for c in candidates if c not in ejected] or candidates) if ejected else candidates
