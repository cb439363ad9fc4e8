"""Which endpoint takes a leg when prefixes are cached (pure; table-tested).

The score of a candidate is the number of prompt tokens it already holds as a
cached prefix. Load bounds it: a candidate with more than ``max_imbalance``
requests in flight above the least loaded candidate is not preferred for its
cache, so one hot prefix cannot pile every request onto one replica (the
others then compute that prefix once and share the load). Equal scores go to
the least loaded, then rotate (``tiebreak``), as pick_least_outstanding does.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass




@dataclass(frozen=True)
class Choice:
    url: str | None
    cached_tokens: int  # cached prefix on the chosen endpoint
    best_tokens: int  # longest cached prefix on any allowed candidate


def matched_prefix(keys: Iterable[int], holds: Callable[[int], bool]) -> int:
    """How many leading block keys ``holds`` (stops at the first miss)."""
    n = 0
    for k in keys:
        if not holds(k):
            break
        n += 1
    return n


def choose_endpoint(
    candidates: Sequence[str],
    cached_tokens: Mapping[str, int],
    outstanding: Mapping[str, int],
    *,
    exclude: Collection[str] = (),
    ejected: Collection[str] = (),
    max_imbalance: int = 4,
    tiebreak: int = 0,
) -> Choice:
    """The candidate with the longest cached prefix within the load bound.

    ``exclude``: already tried for this request (never chosen). ``ejected``:
    failed recently; chosen only when nothing else is left.
    """
    allowed = [c for c in candidates if c not in exclude]
    if not allowed:
        return Choice(None, 0, 0)
    healthy = [c for c in allowed if c not in ejected] or allowed
    least = min(outstanding.get(c, 0) for c in healthy)
    within = [c for c in healthy if outstanding.get(c, 0) <= least + max_imbalance]
    best_anywhere = max(cached_tokens.get(c, 0) for c in healthy)
    top = max(cached_tokens.get(c, 0) for c in within)
    tied = [c for c in within if cached_tokens.get(c, 0) == top]
    load = min(outstanding.get(c, 0) for c in tied)
    tied = [c for c in tied if outstanding.get(c, 0) == load]
    url = tied[tiebreak % len(tied)]
    return Choice(url, cached_tokens.get(url, 0), best_anywhere)


class RoutedIndex:
    """What the router sent where, as prefix keys per endpoint (a bounded LRU).

    The approximation of each engine's cache used before (or without) its KV events.
    """

    def __init__(self, max_keys: int = 200_000) -> None:
        self.max_keys = max_keys
        self._keys: dict[str, OrderedDict[int, None]] = {}

    def record(self, url: str, keys: Sequence[int]) -> None:
        lru = self._keys.setdefault(url, OrderedDict())
        for k in keys:
            lru[k] = None
            lru.move_to_end(k)
        while len(lru) > self.max_keys:
            lru.popitem(last=False)

    def holds(self, url: str) -> Callable[[int], bool]:
        return self._keys.get(url, {}).__contains__

    def forget(self, url: str) -> None:
        self._keys.pop(url, None)

    def size(self, url: str) -> int:
        return len(self._keys.get(url, ()))
