"""Flow control's per-decode bound as a filter of the decode pick (connector/serving/flow/room.py)."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving.flow.room import decode_filters, decodes_with_room, room_first
from pdfleet.connector.serving.picking.chain import PickRequest, PickState, Weighted, run
from pdfleet.contract.flow_control import FlowControlConfig

# (case, candidates, outstanding legs per URL, bound, the candidates with room)
ROOM = [
    ("none busy: all have room", ("d0", "d1"), {}, 2, ("d0", "d1")),
    ("one at the bound is left out", ("d0", "d1"), {"d0": 2, "d1": 1}, 2, ("d1",)),
    ("one below the bound stays", ("d0", "d1"), {"d0": 1}, 2, ("d0", "d1")),
    ("over the bound (legs the gate did not count) is left out", ("d0", "d1"), {"d0": 5}, 2, ("d1",)),
    ("all full: none", ("d0", "d1"), {"d0": 2, "d1": 2}, 2, ()),
    ("bound 1", ("d0", "d1", "d2"), {"d1": 1}, 1, ("d0", "d2")),
    ("counts of other endpoints do not matter", ("d0",), {"p0": 9}, 1, ("d0",)),
    ("the candidates' order is kept", ("d2", "d0", "d1"), {"d0": 3}, 3, ("d2", "d1")),
    ("no candidates", (), {}, 1, ()),
]


@pytest.mark.parametrize("case,candidates,outstanding,bound,expected", ROOM, ids=[r[0] for r in ROOM])
def test_decodes_with_room(case, candidates, outstanding, bound, expected) -> None:
    assert decodes_with_room(candidates, outstanding, bound) == expected


def test_a_bound_below_one_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="maxInFlightPerDecode"):
        decodes_with_room(("d0",), {}, 0)


@pytest.mark.parametrize("outstanding,kept", [
    ({"d0": 2}, ["d1"]),
    ({"d0": 2, "d1": 2}, ["d0", "d1"]),  # none has room (legs the gate did not count): all kept, none failed
])
def test_room_first_as_a_filter_of_the_pick(outstanding, kept) -> None:
    assert list(room_first(2)(("d0", "d1"), PickState(outstanding))) == kept


class Cached:
    """A scorer that finds the whole prompt cached on d0 (as the prefix scorer would)."""

    name = "cached"

    def score(self, request, candidates):
        return {"d0": 100}

    def chosen(self, request, url, scores, candidates) -> None:
        pass


@pytest.mark.parametrize("enabled,picked", [
    (True, "d1"),  # d0 holds the bound: the pick goes where there is room
    (False, "d0"),  # negative control (no flow control, no filter): the cached prefix wins within the load bound
])
def test_the_decode_pick_skips_a_full_decode_under_flow_control(enabled, picked) -> None:
    filters = decode_filters(FlowControlConfig(enabled=enabled, max_in_flight_per_decode=2))
    state = PickState({"d0": 2, "d1": 1})
    got = run(("d0", "d1"), state, filters, (Weighted(Cached()),), PickRequest("decode", {}), max_imbalance=4)
    assert got.url == picked


@pytest.mark.parametrize("enabled,added", [(True, 1), (False, 0)])
def test_the_picker_adds_the_filter_to_the_decode_pick_alone(enabled, added) -> None:
    from pdfleet.connector.serving.endpoints import DECODE, PREFILL
    from pdfleet.connector.serving.router_state import RouterState
    from pdfleet.contract.router_config import RouterConfig

    picker = RouterState(RouterConfig(prefill=("http://p0:8000",), decode=("http://d0:8000",),
                                      flow_control=FlowControlConfig(enabled=enabled))).picker
    filters = {role: picker.profiles[role].filters for role in (PREFILL, DECODE)}
    assert len(filters[DECODE]) == len(filters[PREFILL]) + added
    assert all(getattr(f, "__name__", "") != "with_room" for f in filters[PREFILL])
