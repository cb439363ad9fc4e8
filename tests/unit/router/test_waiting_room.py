"""The waiting room's decisions (connector/serving/waiting_room.py, pure): hold, refuse or pass on
arrival; how an expired wait is answered; when endpoints count as up (issue 41)."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving import waiting_room as wr
from pdfleet.connector.serving.endpoints import Endpoint, RevisionEndpoints, select_revision
from pdfleet.contract.scale_to_zero import REJECTED_NO_ENDPOINTS, REJECTED_TTL_EXPIRED, REJECTED_WAITING_ROOM_FULL

ON = wr.Bounds(max_waiting=3, max_bytes=1000, timeout_s=60.0)
OFF = wr.Bounds(max_waiting=0, max_bytes=1000, timeout_s=60.0)


@pytest.mark.parametrize("bounds, ready, held, held_bytes, size, want", [
    (ON, False, 0, 0, 10, wr.HOLD),  # the first request of a cold fleet
    (ON, False, 2, 500, 10, wr.HOLD),  # the last place
    (ON, False, 3, 30, 10, wr.FULL),  # maxWaiting reached (by count)
    (ON, False, 1, 995, 10, wr.FULL),  # the bodies held would pass max_bytes
    (ON, False, 1, 990, 10, wr.HOLD),  # exactly max_bytes: held
    (ON, False, 0, 0, 1001, wr.FULL),  # one body above the byte bound alone
    (ON, True, 0, 0, 10, wr.PASS),  # a pair is ready: straight on
    (ON, True, 3, 1000, 10, wr.PASS),  # ready: the room's fill does not matter
    # negative control: the room off is the old behaviour (on to choose(), which answers 503 at once)
    (OFF, False, 0, 0, 10, wr.PASS),
    (OFF, False, 50, 0, 10, wr.PASS),
])
def test_arrival(bounds, ready, held, held_bytes, size, want):
    assert wr.arrival(bounds, pair_ready=ready, held=held, held_bytes=held_bytes, size=size) == want


@pytest.mark.parametrize("up, want", [
    (False, wr.Drop(503, REJECTED_NO_ENDPOINTS)),
    (True, wr.Drop(429, REJECTED_TTL_EXPIRED, wr.EXPIRED_RETRY_AFTER_S)),
])
def test_expired(up, want):
    assert wr.expired(endpoints_up=up) == want


def test_room_full_is_a_503_naming_it():
    assert wr.room_full() == wr.Drop(503, REJECTED_WAITING_ROOM_FULL)


P, D = Endpoint("http://p:1"), Endpoint("http://d:1")
P_WAKING, D_WAKING = Endpoint("http://p:1", ready=False), Endpoint("http://d:1", ready=False)


@pytest.mark.parametrize("groups, up, pair", [
    ([], False, False),  # scaled to zero: no endpoint at all
    ([RevisionEndpoints("r1", (P_WAKING,), (D_WAKING,))], False, False),  # pods, none ready yet
    # decode up, prefill still waking: endpoints exist, but no pair (no held request goes decode-alone)
    ([RevisionEndpoints("r1", (P_WAKING,), (D,))], True, False),
    ([RevisionEndpoints("r1", (P,), ())], True, False),  # prefill up, no decode
    ([RevisionEndpoints("r1", (P,), (D,))], True, True),  # the pair is ready
    ([RevisionEndpoints("r1", (P,), ()), RevisionEndpoints("r2", (), (D,))], True, False),  # two halves of two revisions
])
def test_endpoints_up_and_the_pair(groups, up, pair):
    assert wr.endpoints_up(groups) is up
    assert (select_revision(groups).revision is not None) is pair  # what the picker tells the room


@pytest.mark.parametrize("bounds, ready, want", [
    (ON, True, (200, "ok")),
    (ON, False, (200, "waiting")),  # at zero: kept in the Service (else nothing reaches the room) and scraped
    (OFF, True, (200, "ok")),
    (OFF, False, (503, "unavailable")),  # negative control: the room off is the old readiness
])
def test_health(bounds, ready, want):
    assert wr.health(bounds, pair_ready=ready) == want
