"""The render's PromQL evaluator on hand-made recordings, against figures worked out by hand."""

from __future__ import annotations

import pytest

from pdfleet.operator.observability.evaluate import Evaluator, Recording, histogram_quantile


def rec():
    r = Recording()
    for t in range(0, 70, 10):
        r.add(t, "req_total", {"pod": "a", "code": "200"}, 2.0 * t)        # 2/s
        r.add(t, "req_total", {"pod": "b", "code": "200"}, 1.0 * t)        # 1/s
        r.add(t, "req_total", {"pod": "b", "code": "500"}, 0.5 * t)        # 0.5/s
        r.add(t, "bytes_total", {"pod": "a"}, 1e9 * t if t < 40 else 1e9 * (t - 40))  # reset at 40: still 1e9/s
        r.add(t, "queue", {"pod": "a", "ns": "x"}, 3.0)
        r.add(t, "queue", {"pod": "b", "ns": "y"}, 5.0)
        for le, frac in (("0.1", 0.5), ("1.0", 0.9), ("+Inf", 1.0)):
            r.add(t, "lat_seconds_bucket", {"pod": "a", "le": le}, frac * 10 * t)
    return r


def q(expr, t=60, **variables):
    return Evaluator(rec(), variables).query(expr, t, rate_interval="30s")


def values(result):
    return {tuple(v for _, v in k): round(x, 6) for k, x in result.items()}


@pytest.mark.parametrize("expr, want", [
    ("sum by (code) (rate(req_total[$__rate_interval]))", {("200",): 3.0, ("500",): 0.5}),
    ("sum(rate(req_total[30s]))", {(): 3.5}),
    ("sum by (pod) (increase(req_total[30s]))", {("a",): 60.0, ("b",): 45.0}),
    ("rate(bytes_total[30s]) / 1e9", {("a",): 1.0}),                          # across the counter reset
    ('sum(rate(req_total{code="500"}[30s])) / sum(rate(req_total[30s]))', {(): round(0.5 / 3.5, 6)}),
    ('max by (pod) (queue{ns=~"$ns"})', {("a",): 3.0, ("b",): 5.0}),
    ("queue > 4", {("y", "b"): 5.0}),
    ("sum without (ns) (queue)", {("a",): 3.0, ("b",): 5.0}),
    ("histogram_quantile(0.5, sum by (le) (rate(lat_seconds_bucket[30s])))", {(): 0.1}),
    ("histogram_quantile(0.7, sum by (le) (rate(lat_seconds_bucket[30s])))", {(): 0.55}),
    ("histogram_quantile(0.99, sum by (le) (rate(lat_seconds_bucket[30s])))", {(): 1.0}),
])
def test_queries(expr, want):
    assert values(q(expr, ns=".*")) == want


def test_variables_filter_and_a_window_without_samples_is_empty():
    assert values(q('sum(queue{ns=~"$ns"})', ns="x")) == {(): 3.0}
    assert q("rate(req_total[5s])") == {}          # one sample in the window: no rate
    assert q("sum(rate(req_total[30s]))", t=-100) == {}


def test_unsupported_query_says_so():
    with pytest.raises(NotImplementedError, match="topk"):
        q("topk(1, queue)")
    with pytest.raises(NotImplementedError, match="function"):
        q("abs(queue)")


def test_histogram_quantile_edges():
    assert histogram_quantile(0.5, {(("le", "+Inf"),): 0.0, (("le", "1"),): 0.0}) == {}   # no observations
    assert histogram_quantile(0.9, {(("le", "+Inf"),): 10.0, (("le", "1"),): 5.0}) == {(): 1.0}  # in +Inf: top bound
