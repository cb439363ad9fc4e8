"""Scale to zero as a pair (issue 41): the activation and retirement decisions and the front ends' figures
(pure, table tests). Each table holds the negative control beside the case it guards (the same inputs with
one thing changed, and nothing written)."""

from __future__ import annotations

import pytest

from pdfleet.contract import metrics as names
from pdfleet.contract import scale_to_zero as stz
from pdfleet.operator.autoscale.scale_to_zero import (
    ACTIVATE, COMPLETE, HOLD, RETIRE, FrontEndSample, Observation, PairState, condition, decide, observe,
    parse_front_end, poll_interval,
)

IDLE = 300.0
QUIET = Observation()                        # nothing held, nothing moved, nothing in flight
HELD = Observation(waiting=3, activity=True)
BUSY = Observation(activity=True)


def at(p: int, d: int) -> dict[str, int]:
    return {"prefill": p, "decode": d}


# (case, now, observation, scalers, last activity, action, writes)
CASES = [
    ("held at zero: both 0 -> 1", 1000, HELD, at(0, 0), 0.0, ACTIVATE, at(1, 1)),
    ("control: nothing held at zero: nothing written", 1000, QUIET, at(0, 0), 0.0, HOLD, {}),
    ("an episode between two scrapes (counter moved, gauge 0)", 1000, Observation(activated=True, activity=True),
     at(0, 0), 0.0, ACTIVATE, at(1, 1)),
    ("held while serving: nothing to write", 1000, HELD, at(2, 3), 0.0, HOLD, {}),
    ("held mid-retirement (scalers at 0, pods draining): activation again", 1000, HELD, at(0, 0), 999.0, ACTIVATE,
     at(1, 1)),
    ("idle past idleSeconds: both to 0 together", 1000, QUIET, at(2, 3), 1000 - IDLE, RETIRE, at(0, 0)),
    ("control: one second short of idleSeconds", 1000, QUIET, at(2, 3), 1001 - IDLE, HOLD, {}),
    ("control: a request answered just now", 1000, BUSY, at(2, 3), 0.0, HOLD, {}),
    ("control: a stream in flight (not drained)", 1000, Observation(in_flight=1, activity=True), at(1, 1), 0.0,
     HOLD, {}),
    ("half pair while serving: the role at 0 to 1", 1000, BUSY, at(0, 2), 0.0, COMPLETE, {"prefill": 1}),
    ("half pair when idle: the other to 0", 1000, QUIET, at(2, 0), 0.0, COMPLETE, {"prefill": 0}),
    ("half pair with a request held: the role at 0 to 1", 1000, HELD, at(2, 0), 0.0, ACTIVATE, {"decode": 1}),
]


@pytest.mark.parametrize("case,now,obs,scalers,last,action,writes", CASES, ids=[c[0] for c in CASES])
def test_the_pair_decision(case, now, obs, scalers, last, action, writes) -> None:
    d = decide(now, obs, scalers, PairState(last), IDLE)
    assert (d.action, dict(d.writes)) == (action, writes), d.reason


@pytest.mark.parametrize("scalers", [at(0, 0), at(2, 3), at(0, 2)])
def test_no_front_end_read_writes_nothing(scalers) -> None:
    assert decide(1000, None, scalers, PairState(0.0), IDLE).writes == {}


def test_idleness_counts_from_the_first_observation_not_from_zero() -> None:
    """An operator that (re)starts never retires a pair at once: its clock starts at its first read."""
    d = decide(10_000, QUIET, at(1, 1), PairState(None), IDLE)
    assert d.action == HOLD and d.state.last_active == 10_000
    assert decide(10_000 + IDLE, QUIET, at(1, 1), d.state, IDLE).action == RETIRE


def test_no_decision_ever_leaves_one_role_at_zero() -> None:
    """The pair is the unit: over every case and scaler pair, the scalers after the writes are both 0 or both > 0."""
    for obs in (QUIET, HELD, BUSY, Observation(activated=True, activity=True)):
        for p in range(3):
            for d in range(3):
                for last in (0.0, 999.0):
                    after = {**at(p, d), **decide(1000, obs, at(p, d), PairState(last), IDLE).writes}
                    assert (after["prefill"] == 0) == (after["decode"] == 0), (obs, p, d, last, after)


def s(requests=0.0, activations=0.0, waiting=0.0, in_flight=0.0) -> FrontEndSample:
    return FrontEndSample(waiting, activations, requests, in_flight)


# (case, previous scrape, this scrape, expected)
OBSERVATIONS = [
    ("nothing moved", {"r": s(5)}, {"r": s(5)}, Observation()),
    ("a request answered", {"r": s(5)}, {"r": s(6)}, Observation(activity=True)),
    ("a router restarted (counter down)", {"r": s(5)}, {"r": s(0)}, Observation(activity=True)),
    ("a new front end", {"r": s(5)}, {"r": s(5), "e": s(0)}, Observation(activity=True)),
    ("first scrape", None, {"r": s(5)}, Observation(activity=True)),
    ("held at two front ends", {"r": s(5), "e": s(1)}, {"r": s(5, waiting=2), "e": s(1, waiting=1)},
     Observation(waiting=3, activity=True)),
    ("an episode came and went", {"r": s(5, 1)}, {"r": s(6, 2)}, Observation(activated=True, activity=True)),
    ("in flight", {"r": s(5)}, {"r": s(5, in_flight=2)}, Observation(activity=True, in_flight=2)),
    ("a front end gone (scaled in): nothing moved", {"r": s(5), "e": s(9)}, {"r": s(5)}, Observation()),
]


@pytest.mark.parametrize("case,prev,cur,want", OBSERVATIONS, ids=[o[0] for o in OBSERVATIONS])
def test_observe(case, prev, cur, want) -> None:
    assert observe(prev, cur) == want


def test_the_front_ends_page_is_read_by_the_contracts_names() -> None:
    page = (f"# TYPE {stz.ROUTER_WAITING_REQUESTS} gauge\n{stz.ROUTER_WAITING_REQUESTS} 4\n"
            f"# TYPE {stz.ROUTER_ACTIVATIONS} counter\n{stz.ROUTER_ACTIVATIONS}_total 2\n"
            f"# TYPE {names.ROUTER_REVISION_REQUESTS} counter\n"
            f'{names.ROUTER_REVISION_REQUESTS}_total{{revision="a",outcome="answered"}} 7\n'
            f'{names.ROUTER_REVISION_REQUESTS}_total{{revision="b",outcome="5xx"}} 1\n'
            f"# TYPE {names.ROUTER_STREAMS} gauge\n{names.ROUTER_STREAMS}{{revision=\"a\"}} 1\n"
            f"# TYPE {names.ROUTER_LEGS_WAITING} gauge\n"
            f'{names.ROUTER_LEGS_WAITING}{{leg="prefill",revision="a"}} 2\n')
    assert parse_front_end(page) == FrontEndSample(waiting=4, activations=2, requests=8, in_flight=3)
    assert parse_front_end("") == FrontEndSample()   # a front end without a waiting room: nothing held


def test_poll_interval() -> None:
    assert poll_interval(at(0, 0), IDLE) <= 1.0          # activation within a second of the first held request
    assert poll_interval(at(0, 1), IDLE) <= 1.0
    assert poll_interval(at(1, 1), IDLE) == 10.0
    assert poll_interval(at(1, 1), 20) == 2.0


@pytest.mark.parametrize("scalers,ready,waiting,want", [
    (at(0, 0), at(0, 0), 0, (True, "ScaledToZero")),
    (at(0, 0), at(1, 1), 0, (True, "ScaledToZero")),   # retiring: the scalers say where it goes
    (at(1, 1), at(0, 1), 2, (False, "Activating")),
    (at(1, 1), at(1, 1), 0, (False, "Active")),
])
def test_the_scaled_to_zero_condition(scalers, ready, waiting, want) -> None:
    status, reason, message = condition(scalers, ready, waiting)
    assert (status, reason) == want
    assert ("2 request(s) held" in message) == (waiting == 2)


# (case, the scalers as the watch shows them, pending (seen, wrote), effective, still pending)
PENDING = [
    ("written, not shown yet: the write counts", at(0, 0), {"prefill": (0, 1), "decode": (0, 1)}, at(1, 1),
     {"prefill": (0, 1), "decode": (0, 1)}),
    ("shown: forgotten", at(1, 1), {"prefill": (0, 1), "decode": (0, 1)}, at(1, 1), {}),
    ("someone else changed it meanwhile: theirs counts", at(3, 0), {"prefill": (0, 1), "decode": (0, 1)}, at(3, 1),
     {"decode": (0, 1)}),
    ("nothing pending", at(2, 2), {}, at(2, 2), {}),
]


@pytest.mark.parametrize("case,seen,pending,want,still", PENDING, ids=[p[0] for p in PENDING])
def test_a_write_counts_until_the_watch_shows_it(case, seen, pending, want, still) -> None:
    """So that a reconcile running before the watch brings the scaler back never writes a second time."""
    from pdfleet.operator.autoscale.scale_to_zero_edge import effective
    assert effective(seen, pending) == (want, still)


@pytest.mark.parametrize("enabled,floor", [(True, 1), (False, 0)])
def test_the_planner_never_picks_zero_under_scale_to_zero(enabled, floor) -> None:
    """0 <-> 1 is the pair's (both roles together); the planner's floor is 1 (negative control: off, 0 stays 0)."""
    from pdfleet.operator.api import parse
    from pdfleet.operator.autoscale.planner_edge import config_of

    role = {"replicas": 1, "autoscaling": {"minReplicas": 0, "maxReplicas": 4}}
    cr = parse({"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
                "metadata": {"name": "llama", "namespace": "ml"},
                "spec": {"model": {"name": "m"}, "prefill": role, "decode": role,
                         "scaling": {"planner": {"enabled": True}, "scaleToZero": {"enabled": enabled}}}})
    bounds = config_of(cr).bounds
    assert (bounds["prefill"].min, bounds["decode"].min, bounds["decode"].max) == (floor, floor, 4)
