"""What a cached prefix is worth (pure; table-tested): the prompt's leading blocks an index holds, the
outcome of a pick for the metrics, and the router's own record of what it sent where.

The score of a candidate is the number of prompt tokens it already holds as a cached prefix, each block
weighted by the best KV tier that holds it (``tier_order``, ``weighted_tokens``: by default GPU 1.0, CPU
0.75, STORAGE 0.25); the picking chain (serving/picking/chain.py) takes the best score within the load bound.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from pdfleet.contract.kv_tiers import MEDIUMS


def tier_order(weights: Mapping[str, float]) -> tuple[str, ...]:
    """The media to index, best first: those weighted above 0 (a tier at 0 is left out, as every tier but
    GPU was before tiers); equal weights in MEDIUMS' order (GPU, CPU, STORAGE)."""
    return tuple(sorted((m for m in MEDIUMS if weights.get(m, 0) > 0), key=lambda m: -weights[m]))


def weighted_tokens(tokens: Mapping[str, int], weights: Mapping[str, float]) -> float | int:
    """A score from cached prefix tokens by the best tier holding each block; a medium without a weight (the
    routed index's estimate, its tier unknown) counts in full. Whole-weight tiers keep an int score."""
    return sum(n if (w := weights.get(m, 1)) == 1 else n * w for m, n in tokens.items())


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
