"""The planner's decision (pure): SLO pressure, learned capacity, hysteresis, scale-down delay,
min/max and the ratio."""

from __future__ import annotations

import dataclasses

import pytest

from pdfleet.operator.autoscale.clamp import Bounds, Ratio
from pdfleet.operator.autoscale.planner import PlannerConfig, PlannerState, RoleSignal, RoleState, decide  # noqa: F401

CFG = PlannerConfig(targets_s={"prefill": 0.8, "decode": 0.06}, scale_down_delay_s=300,
                    bounds={"prefill": Bounds(1, 8), "decode": Bounds(1, 16)}, ratio=Ratio(0.25, 2.0))


def sig(p90_ms, load):
    return RoleSignal(None if p90_ms is None else p90_ms / 1000, load)


def state(p_cap=None, d_cap=None, p_low=None, d_low=None):
    return PlannerState({"prefill": RoleState(p_cap, p_low), "decode": RoleState(d_cap, d_low)})


# (case, now, signals (prefill, decode), current (p, d), state, expected (p, d), reason fragments)
CASES = [
    ("TTFT missed: prefill up at once", 0, (sig(1200, 6), sig(40, 60)), (3, 4), state(2.0, 20), (6, 4), {"prefill": "up"}),  # 6 / (1.33 x 0.85)
    ("missed without history: at least one more", 0, (sig(900, 2), sig(40, 10)), (2, 4), state(), (3, 4), {"prefill": "up"}),
    ("ITL missed: decode up", 0, (sig(300, 1), sig(90, 120)), (2, 4), state(1.0, 30), (2, 7), {"decode": "up"}),  # capacity 30 -> 21 (at most -30%)
    ("a huge miss at most triples", 0, (sig(30000, 50), sig(40, 10)), (2, 4), state(1.0, 20), (6, 4), {"prefill": "up"}),
    ("hot, but replicas still starting: hold", 0, (RoleSignal(1.2, 6, ready=2), sig(40, 60)), (3, 4), state(2.0, 20), (3, 4),
     {"prefill": "1 replica(s) still starting"}),
    ("within the band: hold", 0, (sig(650, 2.0), sig(50, 60)), (3, 4), state(2.0, 20), (3, 4), {"prefill": "hold"}),
    ("low: wait for the delay", 100, (sig(200, 1.0), sig(20, 10)), (4, 4), state(2.0, 20), (4, 4),
     {"prefill": "down in 300s"}),
    ("low long enough: down by at most 30%", 400, (sig(200, 1.0), sig(20, 10)), (4, 4), state(2.0, 20, p_low=100, d_low=100), (3, 3),
     {"prefill": "down", "decode": "down"}),
    ("low, but not for long enough", 399, (sig(200, 1.0), sig(20, 10)), (4, 4), state(2.0, 20, p_low=100, d_low=100),
     (4, 4), {"prefill": "hold"}),
    ("above max: clamped", 0, (sig(2000, 40), sig(40, 10)), (8, 16), state(1.0, 20), (8, 16), {}),
    ("ratio: prefill limited by decode", 0, (sig(2000, 30), sig(30, 10)), (4, 2), state(1.0, 20), (4, 2), {}),
    ("no traffic: down after the delay", 1000, (sig(None, 0), sig(None, 0)), (3, 6), state(2.0, 20, 600, 600),
     (2, 5), {"prefill": "down", "decode": "down"}),
    ("no traffic: a step at min stays at min", 1000, (sig(None, 0), sig(None, 0)), (1, 1), state(2.0, 20, 600, 600),
     (1, 1), {}),
    ("no traffic, no history: hold", 0, (sig(None, 0), sig(None, 0)), (3, 6), state(), (3, 6), {"prefill": "hold"}),
]


@pytest.mark.parametrize("case,now,signals,current,st,expected,reasons", CASES, ids=[c[0] for c in CASES])
def test_planner_table(case, now, signals, current, st, expected, reasons) -> None:
    d = decide(now, {"prefill": signals[0], "decode": signals[1]}, {"prefill": current[0], "decode": current[1]}, st, CFG)
    assert (d.replicas["prefill"], d.replicas["decode"]) == expected, (case, d.reasons)
    for role, fragment in reasons.items():
        assert fragment in d.reasons[role], (case, d.reasons)


def test_interrupted_low_period_restarts_the_delay() -> None:
    signals_low = {"prefill": sig(200, 1.0), "decode": sig(20, 10)}
    signals_ok = {"prefill": sig(700, 3.5), "decode": sig(50, 60)}
    cur = {"prefill": 4, "decode": 4}
    d = decide(0, signals_low, cur, state(2.0, 20), CFG)
    assert d.state.roles["prefill"].low_since == 0
    d = decide(200, signals_ok, cur, d.state, CFG)          # load came back: no longer low
    assert d.state.roles["prefill"].low_since is None and d.replicas == cur
    d = decide(310, signals_low, cur, d.state, CFG)         # 310 s after the first low, but only just low again
    assert d.replicas["prefill"] == 4 and d.state.roles["prefill"].low_since == 310
    d = decide(610, signals_low, cur, d.state, CFG)
    assert d.replicas["prefill"] == 3, "one step of at most 30%"
    d = decide(640, signals_low, d.replicas, d.state, CFG)   # still low: the next step follows without a new delay
    assert d.replicas["prefill"] == 2


def test_capacity_is_learned_and_a_longer_prompt_lowers_it() -> None:
    """The same load at a higher TTFT (longer prompts) means less capacity per replica: more replicas."""
    cur = {"prefill": 4, "decode": 4}
    d = decide(0, {"prefill": sig(500, 4.0), "decode": sig(40, 40)}, cur, PlannerState(), CFG)
    learned = d.state.roles["prefill"].capacity
    assert learned and learned >= 1.0
    d2 = decide(30, {"prefill": sig(1600, 4.0), "decode": sig(40, 40)}, cur, d.state, CFG)
    assert d2.state.roles["prefill"].capacity < learned and d2.replicas["prefill"] > 4


def test_only_the_driven_roles_move() -> None:
    no_ratio = dataclasses.replace(CFG, ratio=Ratio())   # (with the ratio, prefill would follow decode up)
    d = decide(0, {"prefill": sig(5000, 20), "decode": sig(200, 100)}, {"prefill": 2, "decode": 4}, state(1.0, 20),
               no_ratio, roles=("decode",))
    assert d.replicas["prefill"] == 2 and d.replicas["decode"] > 4 and "prefill" not in d.reasons
