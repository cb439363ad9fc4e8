"""The filters of a pick (pure; see chain.py)."""

from __future__ import annotations

from collections.abc import Sequence

from pdfleet.connector.serving.picking.chain import PickState


def not_tried(candidates: Sequence[str], state: PickState) -> Sequence[str]:
    """A retried leg never goes back to an endpoint this request already tried."""
    return [c for c in candidates if c not in state.tried]


def healthy_first(candidates: Sequence[str], state: PickState) -> Sequence[str]:
    """Endpoints that failed lately are taken only when nothing else is left."""
    return [c for c in candidates if c not in state.ejected] or candidates
