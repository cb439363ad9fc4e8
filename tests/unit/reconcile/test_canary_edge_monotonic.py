"""Issue 30: within a canary step a router's counts only grow. A pod whose counts went down (a restart,
or figures that are not counters) has what it counted before skipped, is counted in
went_down, and counts from its new figures on; a NaN on its page is counted and skipped, never raised."""

from __future__ import annotations

import asyncio

from test_canary_edge import BODY, CANARY, ROUTER, World, cr

from pdfleet.contract import metrics as names
from pdfleet.operator.reconcile.canary import CanaryEdge
from pdfleet.operator.rollout.signals import RevisionSample, went_down


def test_went_down_table() -> None:
    a, b = RevisionSample(requests=10, errors=1), RevisionSample(requests=12, errors=1)
    assert went_down({"p": a}, {"p": b}) == []
    assert went_down({"p": b}, {"p": a}) == ["p"]
    assert went_down({"p": RevisionSample(ttft={0.5: 3})}, {"p": RevisionSample(ttft={0.5: 2})}) == ["p"]
    assert went_down({}, {"p": a}) == []  # a new pod starts its own baseline


class Rejected:
    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def __call__(self, reason: str, n: int) -> None:
        self.counts[reason] = self.counts.get(reason, 0) + n


def step(edge, w, fleet, record, now):
    return asyncio.run(edge.step(("ns", "f"), BODY, fleet, [ROUTER], CANARY, record, now))


def test_a_router_whose_counts_went_down_counts_from_its_new_figures_and_is_counted() -> None:
    w, rejected = World(), Rejected()
    edge = CanaryEdge(w.post_event, fetch=w.fetch, interval_s=1.0, clock=lambda: w.mono,
                      count_rejected=rejected)
    fleet = cr()
    w.serve(40, bad=40)  # before the step
    out = step(edge, w, fleet, None, 1000.0)
    # the router "restarts": its counts drop to 45 good, 0 bad; counted from zero this would be 45
    # answered requests in the step with no error (a pass after the pause); it is skipped instead
    w.metrics.revision_requests.clear()
    w.serve(45)
    w.mono += 2
    out = step(edge, w, fleet, out.record, 1070.0)
    assert rejected.counts == {"went_down": 1}
    assert out.record.state.step == 0 and "0 of 50" in out.record.last_analysis
    # from its new figures on, it counts as usual: 10 errors in 60 requests breach maxErrorRate 0.1
    w.serve(50, bad=10)
    w.mono += 2
    out = step(edge, w, fleet, out.record, 1071.0)
    assert out.record.state.phase == "Aborted" and "error rate 0.167" in out.record.last_analysis
    assert rejected.counts == {"went_down": 1}


def test_a_nan_on_the_page_never_raises() -> None:
    w = World()
    page = (f"# TYPE {names.ROUTER_REVISION_REQUESTS} counter\n"
            f'{names.ROUTER_REVISION_REQUESTS}_total{{revision="new",{names.REVISION_OUTCOME}="{names.OUTCOME_5XX}"}}'
            " NaN\n")

    async def fetch(url: str) -> str:
        return page

    edge = CanaryEdge(w.post_event, fetch=fetch, interval_s=1.0, clock=lambda: w.mono)
    fleet = cr()
    out = step(edge, w, fleet, None, 1000.0)
    w.mono += 2
    out = step(edge, w, fleet, out.record, 1070.0)  # before issue 30: ValueError out of the reconcile
    assert out.record.state.phase == "Progressing" and "0 of 50" in out.record.last_analysis
