"""The canary's I/O edge with a fake /metrics fetch and clock: windows, scrape interval, events, and no
advance without figures (operator/reconcile/canary.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import generate_latest

from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.contract import labels
from pdfleet.contract import metrics as names
from pdfleet.operator.api import parse
from pdfleet.operator.reconcile.canary import CanaryEdge
from pdfleet.operator.reconcile_plan.children import ObservedPod
from pdfleet.operator.rollout.paired import Decision, RolloutState
from pdfleet.operator.rollout.canary import ABORTED, PROGRESSING, PROMOTED

CANARY = Decision("old", "new", frozenset({"old", "new"}), RolloutState(serving="old"), "Canary")
ROUTER = ObservedPod("ns", "f-router-1", "router", None, "10.0.0.9", True, False, (("http", 8000),))


def cr(**analysis: Any):
    return parse({"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
                  "metadata": {"name": "f", "namespace": "ns"},
                  "spec": {"model": {"name": "m"}, "rollout": {"strategy": "Canary", "canary": {
                      "steps": [{"weight": 10, "pauseSeconds": 60}, {"weight": 50, "pauseSeconds": 60}],
                      "analysis": {"minRequests": 50, "maxErrorRate": 0.1, **analysis}}}}})


class World:
    def __init__(self) -> None:
        self.metrics = RouterMetrics()
        self.fail = False
        self.fetches = 0
        self.events: list[tuple[str, str, str]] = []
        self.mono = 0.0

    async def fetch(self, url: str) -> str:
        self.fetches += 1
        if self.fail:
            raise OSError("connection refused")
        assert url == "http://10.0.0.9:8000/metrics"
        return generate_latest(self.metrics.registry).decode()

    async def post_event(self, body, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def serve(self, ok: int, bad: int = 0) -> None:
        self.metrics.revision_requests.labels("new", names.OUTCOME_ANSWERED).inc(ok)
        if bad:
            self.metrics.revision_requests.labels("new", names.OUTCOME_5XX).inc(bad)


BODY: dict[str, Any] = {"metadata": {"name": "f", "namespace": "ns"}}


def run(edge: CanaryEdge, world: World, fleet, record, now: float, body=BODY):
    return asyncio.run(edge.step(("ns", "f"), body, fleet, [ROUTER], CANARY, record, now))


def test_steps_advance_on_figures_of_the_window_only_after_the_pause() -> None:
    w = World()
    edge = CanaryEdge(w.post_event, fetch=w.fetch, interval_s=5.0, clock=lambda: w.mono)
    fleet = cr()
    w.serve(1000)  # before the canary: not the step's
    out = run(edge, w, fleet, None, now=1000.0)
    assert (out.record.state.phase, out.record.state.step, out.weight) == (PROGRESSING, 0, 10)
    assert [e[1] for e in w.events] == ["CanaryStarted"]
    w.serve(60)
    w.mono += 1  # within the interval: no new scrape, the figures are the cached ones
    out = run(edge, w, fleet, out.record, now=1070.0)
    assert w.fetches == 1 and out.record.state.step == 0 and "0 of 50" in out.record.last_analysis
    w.mono += 5
    out = run(edge, w, fleet, out.record, now=1071.0)
    assert w.fetches == 2 and (out.record.state.step, out.weight) == (1, 50)  # 60 requests since the baseline
    assert w.events[-1][1] == "CanaryStepAdvanced" and "step 2 of 2: 50%" in w.events[-1][2]
    assert out.requeue_after == 5.0
    # the next step's window starts at the advance: its figures are new requests only
    w.mono += 5
    out = run(edge, w, fleet, out.record, now=1140.0)
    assert out.record.state.phase == PROGRESSING and "0 of 50" in out.record.last_analysis
    w.serve(55)
    w.mono += 5
    out = run(edge, w, fleet, out.record, now=1141.0)
    assert out.record.state.phase == PROMOTED and out.weight is None and w.events[-1][1] == "CanaryPromoted"


def test_without_router_metrics_it_holds_and_says_why() -> None:
    w = World()
    edge = CanaryEdge(w.post_event, fetch=w.fetch, interval_s=1.0, clock=lambda: w.mono)
    w.fail = True
    out = run(edge, w, cr(), None, now=0.0)
    for t in range(1, 6):
        w.mono += 1
        w.serve(1000, 900)  # a disaster the operator cannot see: no verdict either way
        out = run(edge, w, cr(), out.record, now=3600.0 * t)
        assert out.record.state.phase == PROGRESSING and out.record.state.step == 0
    assert "no router metrics" in out.record.last_analysis and "OSError" in out.record.last_analysis


def test_a_breach_aborts_with_a_warning_and_weight_0() -> None:
    w = World()
    edge = CanaryEdge(w.post_event, fetch=w.fetch, interval_s=1.0, clock=lambda: w.mono)
    out = run(edge, w, cr(), None, now=0.0)
    w.serve(40, 20)
    w.mono += 1
    out = run(edge, w, cr(), out.record, now=1.0)
    assert (out.record.state.phase, out.weight) == (ABORTED, 0)
    assert w.events[-1][:2] == ("Warning", "CanaryAborted") and "maxErrorRate 0.1" in w.events[-1][2]
    # finished: no more scrapes, the weight stays 0
    fetches = w.fetches
    w.mono += 10
    again = run(edge, w, cr(), out.record, now=100.0)
    assert (again.record, again.weight, w.fetches) == (out.record, 0, fetches)


def test_the_annotation_overrides_but_not_a_value_left_from_before() -> None:
    w = World()
    edge = CanaryEdge(w.post_event, fetch=w.fetch, interval_s=1.0, clock=lambda: w.mono)
    stale = {"metadata": {"name": "f", "namespace": "ns", "annotations": {labels.ROLLOUT: labels.ROLLOUT_PROMOTE}}}
    out = run(edge, w, cr(), None, now=0.0, body=stale)
    assert out.record.state.phase == PROGRESSING and out.record.stale_override == labels.ROLLOUT_PROMOTE
    aborted = {"metadata": {"name": "f", "namespace": "ns", "annotations": {labels.ROLLOUT: labels.ROLLOUT_ABORT}}}
    out = run(edge, w, cr(), out.record, now=1.0, body=aborted)
    assert out.record.state.phase == ABORTED and "annotation" in out.record.last_analysis


def test_a_paired_fleet_has_no_canary() -> None:
    w = World()
    edge = CanaryEdge(w.post_event, fetch=w.fetch)
    paired = parse({"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
                    "metadata": {"name": "f", "namespace": "ns"}, "spec": {"model": {"name": "m"}}})
    out = run(edge, w, paired, None, now=0.0)
    assert out.record is None and out.weight is None and w.fetches == 0 and not w.events
