"""Issue 31, operator side: the canary analysis sees the KV path (maxRecomputeRate: requests answered 200
without their KV moving) and steps edited while a canary runs are handled, not raised
(operator/rollout/canary.py: judge, clamp, decide; operator/rollout/signals.py: the decode figures)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from pdfleet.connector.adapter.metric_names import exported_name
from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.contract import metrics as names
from pdfleet.operator.observability.metrics_text import MetricsError
from pdfleet.operator.rollout.canary import (
    ABORTED,
    PROGRESSING,
    PROMOTED,
    Analysis,
    Signals,
    State,
    Step,
    clamp,
    decide,
    judge,
)
from pdfleet.operator.rollout.signals import (
    decode_recomputed,
    parse_decode_recomputed,
    parse_revision_sample,
    step_signals,
)

R = Analysis(max_error_rate=0.05, max_recompute_rate=0.1, min_requests=100)


@pytest.mark.parametrize("signals,analysis,outcome,needle", [
    # every request recomputed, every one answered 200: a breach only the recompute rate sees
    (Signals(200, 0, recomputed=200), R, "breach", "recompute rate 1.000 > maxRecomputeRate 0.1"),
    (Signals(200, 0, recomputed=200), Analysis(max_error_rate=0.05, min_requests=100), "pass", "error rate 0.000"),
    (Signals(200, 0, recomputed=21), R, "breach", "recompute rate 0.105"),
    (Signals(200, 0, recomputed=20), R, "pass", "recompute rate 0.100"),  # at the bound is within it
    (Signals(200, 0, recomputed=0), R, "pass", "recompute rate 0.000, within"),
    # decode's counts can run ahead of the router's (a request counted on decode, answered after the scrape)
    (Signals(200, 0, recomputed=260), R, "breach", "recompute rate 1.000"),
    (Signals(200, 0, recomputed=None), R, "wait", "no recompute figure"),  # set but not measured: no evidence
    (Signals(50, 0, recomputed=50), R, "wait", "50 of 100"),  # too few requests, whatever the rate
    (Signals(200, 40, recomputed=200), R, "breach", "error rate 0.200"),  # 5xx is named first
    (Signals(200, 0, recomputed=200), Analysis(max_recompute_rate=1.0, min_requests=100), "pass", "1.000"),
])
def test_judge_with_a_recompute_limit(signals, analysis, outcome, needle) -> None:
    verdict = judge(signals, analysis)
    assert verdict.outcome == outcome and needle in verdict.reason, verdict


THREE = (Step(10, 60), Step(30, 60), Step(60, 60))


# (case, state, steps, now, expected state, a note?)
CLAMP = [
    ("within the steps: unchanged", State(PROGRESSING, 1, 5.0), THREE, 9.0, State(PROGRESSING, 1, 5.0), False),
    ("on the last step: unchanged", State(PROGRESSING, 2, 5.0), THREE, 9.0, State(PROGRESSING, 2, 5.0), False),
    ("shortened below the step: the last step, pause from now", State(PROGRESSING, 2, 5.0), THREE[:2], 9.0,
     State(PROGRESSING, 1, 9.0), True),
    ("shortened to one step", State(PROGRESSING, 2, 5.0), THREE[:1], 9.0, State(PROGRESSING, 0, 9.0), True),
    ("finished rollouts are left alone", State(ABORTED, 2, 5.0), THREE[:1], 9.0, State(ABORTED, 2, 5.0), False),
    ("promoted left alone", State(PROMOTED, 2, 5.0), THREE[:1], 9.0, State(PROMOTED, 2, 5.0), False),
    ("no steps: left to decide", State(PROGRESSING, 2, 5.0), (), 9.0, State(PROGRESSING, 2, 5.0), False),
]


@pytest.mark.parametrize("case,state,steps,now,want,noted", CLAMP, ids=[c[0] for c in CLAMP])
def test_clamp(case, state, steps, now, want, noted) -> None:
    got, note = clamp(state, steps, now)
    assert got == want and (note is not None) == noted
    if noted:
        assert f"step {state.step + 1} no longer exists" in note and f"weight {steps[-1].weight}" in note


GOOD = Signals(500, 0, 0.1, 0.01, recomputed=0)


# (case, state, steps, signals, now, action, phase, step, weight)
EDITED = [
    ("step 3 of 3, steps cut to 2, passing: hold at step 2's weight", State(PROGRESSING, 2, 0.0), THREE[:2], GOOD,
     500.0, "hold", PROGRESSING, 1, 30),
    ("step 3 of 3, steps cut to 1: hold at its weight", State(PROGRESSING, 2, 0.0), THREE[:1], GOOD, 500.0,
     "hold", PROGRESSING, 0, 10),
    ("cut, and the figures breach: abort", State(PROGRESSING, 2, 0.0), THREE[:2], Signals(500, 0, recomputed=500),
     500.0, "abort", ABORTED, 1, 0),
    ("cut while aborted: stays aborted, weight 0", State(ABORTED, 2, 0.0), THREE[:1], GOOD, 500.0, "done",
     ABORTED, 2, 0),
    ("cut while promoted: stays promoted", State(PROMOTED, 2, 0.0), THREE[:1], GOOD, 500.0, "done", PROMOTED, 2, 100),
    ("steps made longer: the step goes on", State(PROGRESSING, 1, 0.0), (*THREE, Step(90, 60)), GOOD, 500.0,
     "advance", PROGRESSING, 2, 60),
]


@pytest.mark.parametrize("case,state,steps,signals,now,action,phase,step,weight", EDITED, ids=[e[0] for e in EDITED])
def test_decide_after_the_steps_were_edited(case, state, steps, signals, now, action, phase, step, weight) -> None:
    d = decide(state, steps, R, signals, now)  # raised IndexError before issue 31 when cut
    assert (d.action, d.state.phase, d.state.step, d.weight) == (action, phase, step, weight), d.reason


def test_a_shortened_canary_runs_its_new_last_step_then_promotes() -> None:
    state = State(PROGRESSING, 2, 0.0)
    d = decide(state, THREE[:2], R, GOOD, 100.0)
    assert d.action == "hold" and d.state == State(PROGRESSING, 1, 100.0) and "steps edited" in d.reason
    # the new last step's pause runs from the edit: not promoted before it ends
    assert decide(d.state, THREE[:2], R, GOOD, 159.0).action == "hold"
    assert decide(d.state, THREE[:2], R, GOOD, 160.0).action == "promote"


# --- the decode figures -------------------------------------------------------------------------------


def decode_text(per_engine: dict[str, tuple[float, float, float]]) -> str:
    """A decode's connector counters under their exported names: engine -> (pulls, failures, rejected)."""
    registry = CollectorRegistry()
    made = {key: Counter(exported_name(key), "h", ["engine", "model_name"], registry=registry)
            for key in ("transfers", "failures", "params_rejected")}
    for engine, values in per_engine.items():
        for key, value in zip(("transfers", "failures", "params_rejected"), values):
            made[key].labels(engine, "m").inc(value)
    return generate_latest(registry).decode()


def test_parse_decode_counts_failed_pulls_and_refused_params_not_pulls() -> None:
    assert parse_decode_recomputed(decode_text({"0": (100, 3, 4)})) == 7
    assert parse_decode_recomputed(decode_text({"0": (100, 3, 4), "1": (100, 1, 0)})) == 8  # every engine label
    assert parse_decode_recomputed(decode_text({"0": (100, 0, 0)})) == 0
    assert parse_decode_recomputed("") == 0  # a decode without the connector's counters yet
    with pytest.raises(MetricsError):
        parse_decode_recomputed("vllm:pdfleet_connector_pull_failures_total{engine=\"0\" 3\n")


@pytest.mark.parametrize("baseline,current,ranks,want", [
    ({"d0": 10.0, "d1": 5.0}, {"d0": 30.0, "d1": 5.0}, 1, 20.0),
    ({"d0": 10.0}, {"d0": 30.0, "d1": 7.0}, 1, 27.0),  # a pod that appeared since counts from zero
    ({"d0": 10.0}, {"d0": 4.0}, 1, 4.0),  # restarted (its count went down): from zero
    ({"d0": 10.0, "d1": 3.0}, {"d0": 30.0}, 1, 20.0),  # a pod gone: nothing of it
    ({"d0": 0.0}, {"d0": 40.0}, 2, 20.0),  # both TP ranks counted each request
    ({}, {}, 1, 0.0),
])
def test_decode_recomputed_over_a_window(baseline, current, ranks, want) -> None:
    assert decode_recomputed(baseline, current, ranks) == want


def test_step_signals_add_the_routers_fallbacks_to_decodes_recomputed() -> None:
    m = RouterMetrics()
    m.revision_requests.labels("new", names.OUTCOME_ANSWERED).inc(100)
    before = {"r": parse_revision_sample(generate_latest(m.registry).decode(), "new")}
    m.revision_requests.labels("new", names.OUTCOME_ANSWERED).inc(60)
    m.revision_requests.labels("new", names.OUTCOME_FALLBACK).inc(30)
    m.revision_requests.labels("new", names.OUTCOME_5XX).inc(10)
    m.revision_requests.labels("old", names.OUTCOME_FALLBACK).inc(500)  # the other pair's: not counted
    now = {"r": parse_revision_sample(generate_latest(m.registry).decode(), "new")}
    s = step_signals(before, now, recomputed=5.0)
    assert (s.requests, s.errors, s.recomputed) == (100, 10, 35.0)
    assert step_signals(before, now).recomputed is None  # the decodes not read: no recompute figure
