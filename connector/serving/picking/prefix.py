"""The prefix scorer: a candidate's score is the prompt prefix it already holds, in tokens (from the
engines' KV events, or from what the front end routed there: kvaware/prefix_routing.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from pdfleet.connector.serving.kvaware.prefix_routing import CachedPrefix, PrefixRouting
from pdfleet.connector.serving.picking.chain import PickRequest


class PrefixScorer:
    name = "prefix"

    def __init__(self, routing: PrefixRouting) -> None:
        self.routing = routing

    def score(self, request: PickRequest, candidates: Sequence[str]) -> CachedPrefix:
        return self.routing.score(candidates, request.body, chat=request.chat)

    def chosen(self, request: PickRequest, url: str | None, scores: Mapping[str, float],
               candidates: Sequence[str]) -> None:
        assert isinstance(scores, CachedPrefix)
        self.routing.chosen(request.role, url, scores, candidates)
