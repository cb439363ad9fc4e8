"""Which filters and scorers pick each role's endpoints, from the fleet's policies (the registry of
scorers: a new scorer is a module beside prefix.py, a line here, and its weight in a profile)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from pdfleet.connector.serving.kvaware.prefix_routing import PrefixRouting
from pdfleet.connector.serving.picking import filters
from pdfleet.connector.serving.picking.chain import Filter, Scorer, Weighted
from pdfleet.connector.serving.picking.prefix import PrefixScorer
from pdfleet.contract.routing import LEAST_OUTSTANDING, PREFIX_AWARE

# Every pick: never an endpoint this request tried, failed ones last.
FILTERS: tuple[Filter, ...] = (filters.not_tried, filters.healthy_first)

# Scorer name -> how to make it from the front end's prefix-routing state.
SCORERS: dict[str, Callable[[PrefixRouting], Scorer]] = {
    PrefixScorer.name: PrefixScorer,
}

# A role's policy (spec.router.prefillPolicy / decodePolicy) -> its scorers and their weights.
POLICY_SCORERS: dict[str, tuple[tuple[str, float], ...]] = {
    PREFIX_AWARE: ((PrefixScorer.name, 1.0),),  # the longest cached prefix within the load bound
    LEAST_OUTSTANDING: (),  # no scorer: the least loaded
}


@dataclass(frozen=True)
class Profile:
    filters: tuple[Filter, ...]
    scorers: tuple[Weighted, ...]
    max_imbalance: int  # the picker's load bound (chain.take)


def profile(policy: str, routing: PrefixRouting, max_imbalance: int,
            extra_filters: Sequence[Filter] = ()) -> Profile:
    scorers = tuple(Weighted(SCORERS[name](routing), weight) for name, weight in POLICY_SCORERS[policy])
    return Profile(FILTERS + tuple(extra_filters), scorers, max_imbalance)
