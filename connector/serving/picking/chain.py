"""One pick as a chain (pure; table-tested): filters -> scorers -> picker.

- A filter narrows the candidates (never tried ones, healthy ones first, ...).
- A scorer gives each remaining candidate a score (cached prompt tokens, ...), with a weight.
- The picker takes the candidate with the highest weighted score among those within the load bound
  (at most ``max_imbalance`` legs in flight above the least loaded: one hot prefix cannot pile every
  request onto one engine), then the least loaded, then rotates (``tiebreak``) so that an idle fleet
  still spreads requests. With no scorer it is the least-loaded pick.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

# Tuples, not frozen dataclasses: a pick makes each anew, and it runs several times per request.


class PickState(NamedTuple):
    """What a pick knows besides the candidates: load, what this request tried, what failed lately."""

    outstanding: Mapping[str, int]
    tried: Collection[str] = ()
    ejected: Collection[str] = ()
    tiebreak: int = 0


class PickRequest(NamedTuple):
    """What scorers read of the request a leg serves."""

    role: str
    body: Mapping[str, Any]
    chat: bool = False


# A filter: (candidates, state) -> the candidates it keeps, in their order.
Filter = Callable[[Sequence[str], PickState], Sequence[str]]


class Scorer(Protocol):
    """Scores candidates for one request; ``chosen`` hears the outcome (for its metrics and memory)."""

    name: str

    def score(self, request: PickRequest, candidates: Sequence[str]) -> Mapping[str, float]: ...

    def chosen(self, request: PickRequest, url: str | None, scores: Mapping[str, float],
               candidates: Sequence[str]) -> None: ...


class Weighted(NamedTuple):
    scorer: Scorer
    weight: float = 1.0


class Picked(NamedTuple):
    url: str | None
    score: float  # the chosen candidate's weighted score
    best: float  # the best weighted score among the scored candidates


NOTHING = Picked(None, 0, 0)


def weighted_scores(parts: Sequence[tuple[float, Mapping[str, float]]], candidates: Sequence[str]
                    ) -> Mapping[str, float]:
    """Each candidate's weighted sum (a weight of 1 keeps a score as it is: int scores stay ints)."""
    if not parts:
        return {}
    if len(parts) == 1 and parts[0][0] == 1:
        return parts[0][1]  # one scorer at weight 1: its scores are the sums
    totals: dict[str, float] = {}
    for c in candidates:
        total: float = 0
        for weight, scores in parts:
            s = scores.get(c, 0)
            total += s if weight == 1 else weight * s
        totals[c] = total
    return totals


def take(candidates: Sequence[str], scores: Mapping[str, float], outstanding: Mapping[str, int], *,
         max_imbalance: int, tiebreak: int) -> Picked:
    """The picker: the top score within the load bound, then the least loaded, then rotation."""
    if not candidates:
        return NOTHING
    loads = [outstanding.get(c, 0) for c in candidates]
    least = min(loads)
    if not scores:  # nothing scored: the least loaded, rotated
        tied = [c for c, load in zip(candidates, loads) if load == least]
        return Picked(tied[tiebreak % len(tied)], 0, 0)
    within = [c for c, load in zip(candidates, loads) if load <= least + max_imbalance]
    top = max(scores.get(c, 0) for c in within)
    tied = [c for c in within if scores.get(c, 0) == top]
    load = min(outstanding.get(c, 0) for c in tied)
    tied = [c for c in tied if outstanding.get(c, 0) == load]
    url = tied[tiebreak % len(tied)]
    return Picked(url, scores.get(url, 0), max(scores.get(c, 0) for c in candidates))


def run(candidates: Sequence[str], state: PickState, filters: Sequence[Filter], scorers: Sequence[Weighted],
        request: PickRequest | None, *, max_imbalance: int, notify: bool = True) -> Picked:
    """Filters, then scorers on what is left, then the picker; scorers hear the choice when ``notify``."""
    for f in filters:
        candidates = f(candidates, state)
        if not candidates:
            return NOTHING
    if request is None or not scorers:  # nothing to score: the least-loaded pick
        return take(candidates, {}, state.outstanding, max_imbalance=max_imbalance, tiebreak=state.tiebreak)
    parts = [(w.weight, w.scorer.score(request, candidates)) for w in scorers]
    picked = take(candidates, weighted_scores(parts, candidates), state.outstanding,
                  max_imbalance=max_imbalance, tiebreak=state.tiebreak)
    if notify:
        for w, (_, scores) in zip(scorers, parts):
            w.scorer.chosen(request, picked.url, scores, candidates)
    return picked
