"""Router metrics text -> planner signals: p90 of an interval from cumulative buckets, restarts, gauges."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest

from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.operator.autoscale.signals import interval_signals, interval_went_down, parse_router_metrics
from pdfleet.operator.observability.metrics_text import MetricsError


def sample(ttft=(), itl=(), waiting=(0, 0), streams=0, revision="r1"):
    m = RouterMetrics()
    for v in ttft:
        m.ttft.labels(revision).observe(v)
    for v in itl:
        m.itl.labels(revision).observe(v)
    m.legs_waiting.labels("prefill", revision).set(waiting[0])
    m.legs_waiting.labels("decode", revision).set(waiting[1])
    m.streams.labels(revision).set(streams)
    return parse_router_metrics(generate_latest(m.registry).decode())


def test_interval_p90_comes_from_the_difference_of_two_scrapes() -> None:
    before = sample(ttft=[0.1] * 200)                     # an old, fast period
    after = sample(ttft=[0.1] * 200 + [1.2] * 10, itl=[0.03] * 20, waiting=(3, 1), streams=7)
    sig = interval_signals({"router-0": before}, {"router-0": after})
    assert 1.0 < sig["prefill"].p90_s <= 1.25, "only the interval's slow requests count"
    assert 0.025 < sig["decode"].p90_s <= 0.03
    assert sig["prefill"].load == 3 and sig["decode"].load == 8
    # Negative control: against no previous scrape the old fast requests dominate.
    assert interval_signals({}, {"router-0": after})["prefill"].p90_s < 1.0


def test_routers_are_summed_and_one_whose_counts_went_down_is_skipped() -> None:
    prev = {"a": sample(ttft=[0.1] * 100), "b": sample(ttft=[0.1] * 5)}
    cur = {"a": sample(ttft=[0.1] * 100 + [0.35] * 9, waiting=(2, 0)),
           "b": sample(ttft=[5.0] * 3, waiting=(1, 0))}       # b's count went down (a restart, or made up)
    sig = interval_signals(prev, cur)
    assert 0.3 < sig["prefill"].p90_s <= 0.4 and sig["prefill"].load == 3
    assert interval_went_down(prev, cur) == ["b"]
    # Negative control: had b counted from zero, its three 5 s requests would set the p90.
    assert interval_signals({"a": prev["a"]}, cur)["prefill"].p90_s > 0.4


def test_no_requests_means_no_p90() -> None:
    s = sample(ttft=[0.2] * 3)
    assert interval_signals({"a": s}, {"a": s})["prefill"].p90_s is None


def test_garbage_is_an_error_not_a_crash() -> None:
    with pytest.raises(MetricsError):
        parse_router_metrics("this is { not prometheus")
