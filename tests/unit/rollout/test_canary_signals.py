"""A canary step's figures from the router's Prometheus text (operator/rollout/signals.py) and the
annotation override (operator/rollout/canary.py: effective_override)."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.contract import metrics as names
from pdfleet.operator.observability.metrics_text import MetricsError
from pdfleet.operator.rollout.canary import ABORT, PROMOTE, Signals, effective_override
from pdfleet.operator.rollout.signals import RevisionSample, parse_revision_sample, step_signals


def router_text(per_revision: dict[str, tuple[int, int, list[float], list[float]]]) -> str:
    """The real router's metrics registry, filled: revision -> (answered, 5xx, ttfts, itls)."""
    m = RouterMetrics()
    for rev, (ok, bad, ttfts, itls) in per_revision.items():
        m.revision_requests.labels(rev, names.OUTCOME_ANSWERED).inc(ok)
        m.revision_requests.labels(rev, names.OUTCOME_5XX).inc(bad)
        for v in ttfts:
            m.ttft.labels(rev).observe(v)
        for v in itls:
            m.itl.labels(rev).observe(v)
    return generate_latest(m.registry).decode()


def test_parse_reads_only_the_asked_revision() -> None:
    text = router_text({"new": (90, 10, [0.1] * 5, [0.01] * 3), "old": (1000, 500, [9.0] * 50, [1.0] * 9)})
    s = parse_revision_sample(text, "new")
    assert (s.requests, s.errors) == (100, 10)
    assert s.ttft[float("inf")] == 5 and s.itl[float("inf")] == 3
    assert parse_revision_sample(text, "absent") == RevisionSample()
    with pytest.raises(MetricsError):
        parse_revision_sample("pdfleet_router_revision_requests_total{revision=\"new\" 3\n", "new")


def s(requests, errors, ttft=None, itl=None) -> RevisionSample:
    return RevisionSample(requests, errors, ttft or {}, itl or {})


TTFT_A = {0.1: 10.0, 0.5: 10.0, float("inf"): 10.0}  # 10 answers, all under 100 ms
TTFT_B = {0.1: 10.0, 0.5: 110.0, float("inf"): 110.0}  # then 100 more between 100 and 500 ms


@pytest.mark.parametrize("case,baseline,current,want", [
    ("one pod, the step's difference", {"r1": s(100, 2, TTFT_A)}, {"r1": s(250, 12, TTFT_B)},
     Signals(150, 10, 0.46, None)),
    ("two pods summed", {"r1": s(100, 2), "r2": s(10, 0)}, {"r1": s(150, 2), "r2": s(40, 3)}, Signals(80, 3)),
    ("a pod new since the baseline counts from zero", {"r1": s(100, 2)}, {"r1": s(110, 2), "r3": s(5, 5)},
     Signals(15, 5)),
    ("a restarted pod (a count went down) counts from zero", {"r1": s(100, 2)}, {"r1": s(7, 1)}, Signals(7, 1)),
    ("a pod gone since the baseline adds nothing", {"r1": s(100, 2), "r2": s(50, 0)}, {"r1": s(120, 2)},
     Signals(20, 0)),
    ("nothing new", {"r1": s(100, 2, TTFT_A)}, {"r1": s(100, 2, TTFT_A)}, Signals(0, 0)),
])
def test_step_signals(case, baseline, current, want) -> None:
    got = step_signals(baseline, current)
    assert (got.requests, got.errors, got.itl_p90_s) == (want.requests, want.errors, want.itl_p90_s), case
    if want.ttft_p90_s is None:
        assert got.ttft_p90_s is None, case
    else:  # p90 of the step's 100 answers between 100 and 500 ms and its 0 new fast ones: interpolated
        assert got.ttft_p90_s == pytest.approx(want.ttft_p90_s, abs=0.01), case


@pytest.mark.parametrize("annotation,stale,override,stale_after", [
    (None, None, None, None),
    (PROMOTE, None, PROMOTE, None),
    (ABORT, None, ABORT, None),
    ("yes", None, None, None),  # unknown value: no override
    (PROMOTE, PROMOTE, None, PROMOTE),  # left from an earlier rollout: ignored
    (ABORT, PROMOTE, ABORT, None),  # changed since: honoured
    (None, PROMOTE, None, None),  # removed: forgotten, so setting it again counts
])
def test_effective_override(annotation, stale, override, stale_after) -> None:
    assert effective_override(annotation, stale) == (override, stale_after)
