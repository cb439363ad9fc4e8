"""The canary edge with maxRecomputeRate (issue 31): it reads the new revision's decode pods' /metrics
beside the routers', judges the recompute rate over the step's window, holds when it cannot read
them, and survives steps shortened mid-canary (operator/reconcile/canary.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest

from pdfleet.connector.adapter.metric_names import exported_name
from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.contract import metrics as names
from pdfleet.operator.api import parse
from pdfleet.operator.reconcile.canary import CanaryEdge
from pdfleet.operator.reconcile_plan.children import ObservedPod
from pdfleet.operator.rollout.paired import CanaryRecord, Decision, RolloutState
from pdfleet.operator.rollout.canary import ABORTED, PROGRESSING, PROMOTED, State

CANARY = Decision("old", "new", frozenset({"old", "new"}), RolloutState(serving="old"), "Canary")
ROUTER = ObservedPod("ns", "f-router-1", "router", None, "10.0.0.9", True, False, (("http", 8000),))
DECODE_NEW = ObservedPod("ns", "f-decode-new-0", "decode", "new", "10.0.1.5", True, False, (("http", 8000),))
DECODE_OLD = ObservedPod("ns", "f-decode-old-0", "decode", "old", "10.0.1.6", True, False, (("http", 8000),))
PODS = [ROUTER, DECODE_NEW, DECODE_OLD]


def cr(steps=((10, 60), (50, 60)), tp: int = 1, **analysis: Any):
    return parse({"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
                  "metadata": {"name": "f", "namespace": "ns"},
                  "spec": {"model": {"name": "m"}, "decode": {"tensorParallelSize": tp},
                           "rollout": {"strategy": "Canary", "canary": {
                               "steps": [{"weight": w, "pauseSeconds": p} for w, p in steps],
                               "analysis": {"minRequests": 50, "maxErrorRate": 0.1, **analysis}}}}})


class World:
    def __init__(self) -> None:
        self.router = RouterMetrics()
        self.registry = CollectorRegistry()
        self.rejected = Counter(exported_name("params_rejected"), "h", ["engine"], registry=self.registry)
        self.failed = Counter(exported_name("failures"), "h", ["engine"], registry=self.registry)
        self.decode_down = False
        self.urls: list[str] = []
        self.events: list[tuple[str, str, str]] = []
        self.mono = 0.0

    async def fetch(self, url: str) -> str:
        self.urls.append(url)
        if url == "http://10.0.0.9:8000/metrics":
            return generate_latest(self.router.registry).decode()
        if url == "http://10.0.1.5:8000/metrics":
            if self.decode_down:
                raise OSError("connection refused")
            return generate_latest(self.registry).decode()
        raise AssertionError(f"scraped {url}: not the new pair's decode nor the router")

    async def post_event(self, body, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def serve(self, ok: int, recomputed: int = 0) -> None:
        self.router.revision_requests.labels("new", names.OUTCOME_ANSWERED).inc(ok)
        if recomputed:
            self.rejected.labels("0").inc(recomputed)


BODY: dict[str, Any] = {"metadata": {"name": "f", "namespace": "ns"}}


def step(edge: CanaryEdge, w: World, fleet, record, now: float):
    w.mono += 10  # past the scrape interval: every call reads again
    return asyncio.run(edge.step(("ns", "f"), BODY, fleet, PODS, CANARY, record, now))


def test_every_request_recomputed_aborts_on_the_recompute_rate() -> None:
    w = World()
    edge = CanaryEdge(w.post_event, fetch=w.fetch, interval_s=1.0, clock=lambda: w.mono)
    fleet = cr(maxRecomputeRate=0.05)
    w.serve(500, recomputed=500)  # before the window: not the step's
    out = step(edge, w, fleet, None, 0.0)
    assert "http://10.0.1.5:8000/metrics" in w.urls and "http://10.0.1.6:8000/metrics" not in w.urls
    w.serve(80, recomputed=80)  # HTTP 200 every one: no 5xx
    out = step(edge, w, fleet, out.record, 1.0)
    assert (out.record.state.phase, out.weight) == (ABORTED, 0)
    assert "recompute rate 1.000 > maxRecomputeRate 0.05" in out.record.last_analysis
    assert w.events[-1][:2] == ("Warning", "CanaryAborted")


def test_the_same_pair_without_the_limit_walks_on_and_decodes_are_not_read() -> None:
    w = World()
    edge = CanaryEdge(w.post_event, fetch=w.fetch, interval_s=1.0, clock=lambda: w.mono)
    fleet = cr(steps=((10, 0), (50, 0)))
    out = step(edge, w, fleet, None, 0.0)
    for now in (1.0, 2.0):
        w.serve(80, recomputed=80)
        out = step(edge, w, fleet, out.record, now)
    assert out.record.state.phase == PROMOTED
    assert all("10.0.1." not in u for u in w.urls)


def test_a_healthy_pair_passes_with_its_rate_in_the_verdict_and_tp_ranks_counted_once() -> None:
    w = World()
    edge = CanaryEdge(w.post_event, fetch=w.fetch, interval_s=1.0, clock=lambda: w.mono)
    fleet = cr(steps=((10, 0), (50, 0)), tp=2, maxRecomputeRate=0.05)
    out = step(edge, w, fleet, None, 0.0)
    w.serve(100, recomputed=8)  # 4 requests, counted by both ranks: 0.04
    out = step(edge, w, fleet, out.record, 1.0)
    assert (out.record.state.phase, out.record.state.step) == (PROGRESSING, 1), out.record.last_analysis
    assert "recompute rate 0.040" in out.record.last_analysis


def test_without_decode_metrics_it_holds_and_says_why() -> None:
    w = World()
    edge = CanaryEdge(w.post_event, fetch=w.fetch, interval_s=1.0, clock=lambda: w.mono)
    fleet = cr(steps=((10, 0), (50, 0)), maxRecomputeRate=0.05)
    w.decode_down = True
    out = step(edge, w, fleet, None, 0.0)
    for t in range(1, 5):
        w.serve(500, recomputed=500)
        out = step(edge, w, fleet, out.record, float(t))
        assert (out.record.state.phase, out.record.state.step) == (PROGRESSING, 0)
    assert "no decode metrics" in out.record.last_analysis and "OSError" in out.record.last_analysis
    # once readable, the window starts then: the requests it did not see are not judged
    w.decode_down = False
    out = step(edge, w, fleet, out.record, 10.0)
    assert out.record.state.phase == PROGRESSING and "0 of 50" in out.record.last_analysis


def test_steps_shortened_mid_canary_continue_at_the_new_last_step() -> None:
    w = World()
    edge = CanaryEdge(w.post_event, fetch=w.fetch, interval_s=1.0, clock=lambda: w.mono)
    record = CanaryRecord("new", State(PROGRESSING, 2, 0.0), 60, "step 3 of 3")
    fleet = cr(steps=((10, 60), (30, 60)))  # was three steps, the canary on the third
    out = step(edge, w, fleet, record, 100.0)
    assert (out.record.state.step, out.weight) == (1, 30) and "steps edited" in out.record.last_analysis
    assert out.requeue_after is not None
    out = step(edge, w, fleet, out.record, 130.0)  # a new window at the new weight; the pause runs from 100
    w.serve(80)
    out = step(edge, w, fleet, out.record, 131.0)
    assert out.record.state.phase == PROGRESSING and "pause ends" in out.record.last_analysis
    w.serve(80)
    out = step(edge, w, fleet, out.record, 161.0)
    assert out.record.state.phase == PROMOTED, out.record.last_analysis
