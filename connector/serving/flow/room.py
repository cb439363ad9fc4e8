"""Which decodes may take one more decode leg under flow control's per-decode bound (pure).

``maxInFlightPerDecode`` bounds the legs each decode holds, not only their sum: the gate
(gate.py ``wait_for_decode``) keeps the total within ready decodes x the bound, and this filter
keeps the decode pick off a decode that already holds the bound, so that no one decode takes more
while another has room. A filter ahead of the picker's scorers: it narrows the candidates, it does
not choose among them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from pdfleet.connector.serving.picking.chain import Filter, PickState
from pdfleet.contract.flow_control import FlowControlConfig


def decodes_with_room(candidates: Iterable[str], outstanding: Mapping[str, int], bound: int) -> tuple[str, ...]:
    """The candidates holding fewer than ``bound`` legs (``outstanding``: legs in flight per URL), in
    their order. Empty when every one is full: the caller decides what a full fleet means."""
    if bound < 1:
        raise ValueError(f"maxInFlightPerDecode: must be >= 1, got {bound!r}")
    return tuple(url for url in candidates if outstanding.get(url, 0) < bound)


def room_first(bound: int) -> Filter:
    """``decodes_with_room`` as a filter of the picking chain (picking/chain.py). When no candidate has
    room it keeps them all: the gate keeps decode's total within its capacity, so that happens only with
    legs it did not count (a route outside flow control, a gateway subset narrower than the ready
    decodes, a retry after the one decode with room failed), and a request it admitted is not failed
    for them."""
    if bound < 1:
        raise ValueError(f"maxInFlightPerDecode: must be >= 1, got {bound!r}")

    def with_room(candidates: Sequence[str], state: PickState) -> Sequence[str]:
        return decodes_with_room(candidates, state.outstanding, bound) or candidates
    return with_room


def decode_filters(config: FlowControlConfig) -> tuple[Filter, ...]:
    """The decode pick's filters flow control adds: the per-decode bound when it is enabled, else none."""
    return (room_first(config.max_in_flight_per_decode),) if config.enabled else ()
