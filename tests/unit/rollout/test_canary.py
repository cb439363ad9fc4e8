"""The canary's decision core (operator/rollout/canary.py): analysis, steps, abort, promote, overrides."""

from __future__ import annotations

import pytest

from pdfleet.operator.rollout.canary import (
    ABORTED,
    PROGRESSING,
    PROMOTED,
    Analysis,
    Signals,
    State,
    Step,
    decide,
    judge,
)

A = Analysis(ttft_ms=800, itl_ms=60, max_error_rate=0.01, min_requests=100)
STEPS = (Step(10, 60), Step(50, 120))
GOOD = Signals(requests=500, errors=2, ttft_p90_s=0.5, itl_p90_s=0.04)


@pytest.mark.parametrize("signals,analysis,outcome,needle", [
    (GOOD, A, "pass", "500 requests"),
    (Signals(99, 0, 0.1, 0.01), A, "wait", "99 of 100"),
    (Signals(500, 6, 0.5, 0.04), A, "breach", "error rate 0.012 > maxErrorRate 0.01"),
    (Signals(500, 5, 0.5, 0.04), A, "pass", "error rate 0.010"),  # at the bound is within it
    (Signals(500, 0, 0.9, 0.04), A, "breach", "TTFT p90 900 ms > 800 ms"),
    (Signals(500, 0, 0.5, 0.07), A, "breach", "ITL p90 70 ms > 60 ms"),
    (Signals(500, 0, None, None), A, "pass", ""),  # no latency figure yet (no stream): not a breach
    (Signals(500, 400, 9.0, 9.0), Analysis(min_requests=1), "pass", ""),  # no limits set: nothing to breach
    (Signals(0, 0), Analysis(min_requests=0, max_error_rate=0.1), "wait", "0 of 1"),  # no requests: no evidence
])
def test_judge(signals, analysis, outcome, needle) -> None:
    verdict = judge(signals, analysis)
    assert verdict.outcome == outcome and needle in verdict.reason


# (case, state, signals, now, override, action, new phase, new step, weight)
DECIDE = [
    ("pass within the pause: hold", State(PROGRESSING, 0, 0.0), GOOD, 30.0, None, "hold", PROGRESSING, 0, 10),
    ("pass after the pause: advance", State(PROGRESSING, 0, 0.0), GOOD, 60.0, None, "advance", PROGRESSING, 1, 50),
    ("last step passes: promote", State(PROGRESSING, 1, 100.0), GOOD, 220.0, None, "promote", PROMOTED, 1, 100),
    ("breach within the pause: abort at once", State(PROGRESSING, 0, 0.0), Signals(500, 0, 2.0, 0.01), 5.0, None,
     "abort", ABORTED, 0, 0),
    ("breach on the last step: abort", State(PROGRESSING, 1, 0.0), Signals(500, 100, 0.5, 0.01), 500.0, None,
     "abort", ABORTED, 1, 0),
    ("no evidence after the pause: hold", State(PROGRESSING, 0, 0.0), Signals(10, 0), 10_000.0, None,
     "hold", PROGRESSING, 0, 10),
    ("annotation abort beats a pass", State(PROGRESSING, 0, 0.0), GOOD, 60.0, "abort", "abort", ABORTED, 0, 0),
    ("annotation promote beats a breach", State(PROGRESSING, 0, 0.0), Signals(500, 500, 9.0, 9.0), 1.0, "promote",
     "promote", PROMOTED, 0, 100),
    ("aborted stays aborted", State(ABORTED, 1, 5.0), GOOD, 999.0, "promote", "done", ABORTED, 1, 0),
    ("promoted stays promoted", State(PROMOTED, 1, 5.0), Signals(500, 500), 999.0, "abort", "done", PROMOTED, 1, 100),
]


@pytest.mark.parametrize("case,state,signals,now,override,action,phase,step,weight", DECIDE, ids=[d[0] for d in DECIDE])
def test_decide(case, state, signals, now, override, action, phase, step, weight) -> None:
    d = decide(state, STEPS, A, signals, now, override)
    assert (d.action, d.state.phase, d.state.step, d.weight) == (action, phase, step, weight), d.reason
    if action in ("advance", "promote", "abort"):
        assert d.state.step_started == now  # the next step's window starts now
    if action == "hold":
        assert d.state == state


def test_a_passing_canary_walks_every_step_then_promotes() -> None:
    state, now, weights = State(PROGRESSING, 0, 0.0), 0.0, []
    for _ in range(20):
        d = decide(state, STEPS, A, GOOD, now)
        weights.append(d.weight)
        if d.state.phase != PROGRESSING:
            break
        state, now = d.state, now + 30.0
    assert d.action == "promote" and weights == [10, 10, 50, 50, 50, 50, 100]


def test_no_steps_promotes_at_once() -> None:
    assert decide(State(), (), A, Signals(0, 0), 0.0).action == "promote"
