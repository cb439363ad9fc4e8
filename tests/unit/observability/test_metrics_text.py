"""The operator's one reader of Prometheus text: parse, screen, sum over label filters, histogram
quantile (PromQL's), with the bad inputs it must survive (garbage, NaN, a histogram without +Inf)."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from pdfleet.operator.observability.metrics_text import (
    NEGATIVE, NOT_FINITE, MetricsError, buckets, families, histogram_quantile, lenient_samples, rejected_values,
    sample_text, samples, screen, series, total, total_by, usable_samples,
)

INF = float("inf")

PAGE = """\
# HELP req_total Requests.
# TYPE req_total counter
req_total{code="200",pod="a"} 7.0
req_total{code="200",pod="b"} 3.0
req_total{code="503",pod="a"} 2.0
req_total{pod="c"} 1.0
req_created{code="200",pod="a"} 1.7e9
# TYPE lat_seconds histogram
lat_seconds_bucket{le="0.1",rev="r1"} 4.0
lat_seconds_bucket{le="1.0",rev="r1"} 9.0
lat_seconds_bucket{le="+Inf",rev="r1"} 10.0
lat_seconds_bucket{le="0.1",rev="r2"} 1.0
lat_seconds_bucket{le="1.0",rev="r2"} 1.0
lat_seconds_bucket{le="+Inf",rev="r2"} 2.0
lat_seconds_count{rev="r1"} 10.0
lat_seconds_sum{rev="r1"} 3.0
"""


@pytest.mark.parametrize("names,labels,expected", [
    (("req_total",), {}, 13.0),
    (("req_total",), {"code": "200"}, 10.0),
    (("req_total",), {"code": "200", "pod": "b"}, 3.0),
    (("req_total",), {"code": "404"}, 0.0),               # no such series: 0, not an error
    (("req_total", "req_created"), {"pod": "a", "code": "200"}, 7.0 + 1.7e9),
    (("req",), {}, 0.0),                                   # a family name is not a series name
])
def test_total(names, labels, expected) -> None:
    assert total(samples(PAGE), *names, **labels) == expected


@pytest.mark.parametrize("label,default,labels,expected", [
    ("code", None, {}, {"200": 10.0, "503": 2.0}),         # pod c has no code: left out
    ("code", "?", {}, {"200": 10.0, "503": 2.0, "?": 1.0}),
    ("code", None, {"pod": "a"}, {"200": 7.0, "503": 2.0}),
    ("pod", None, {"code": "200"}, {"a": 7.0, "b": 3.0}),
])
def test_total_by(label, default, labels, expected) -> None:
    assert total_by(samples(PAGE), "req_total", label, default, **labels) == expected


def test_buckets_sum_over_the_other_labels() -> None:
    found = samples(PAGE)
    assert buckets(found, "lat_seconds", rev="r1") == {0.1: 4.0, 1.0: 9.0, INF: 10.0}
    assert buckets(found, "lat_seconds") == {0.1: 5.0, 1.0: 10.0, INF: 12.0}
    assert buckets(found, "lat_seconds", rev="r3") == {}
    assert [s.labels["pod"] for s in series(found, "req_total", code="200")] == ["a", "b"]


@pytest.mark.parametrize("counts,q,expected", [
    ({0.1: 0, 0.2: 10, INF: 10}, 0.9, 0.19),               # all in (0.1, 0.2]: linear inside
    ({0.1: 5, 0.2: 10, INF: 10}, 0.5, 0.1),
    ({0.1: 4, 1.0: 9, INF: 10}, 0.5, 0.1 + 0.9 * (1 / 5)),
    ({0.1: 10, 1.0: 10, INF: 10}, 0.9, 0.09),              # the first bucket interpolates from 0
    ({0.1: 0, 1.0: 0, INF: 4}, 0.9, 1.0),                  # in the +Inf bucket: the last finite bound
    ({-1.0: 5, 1.0: 10, INF: 10}, 0.2, -1.0),              # a first bound at or below 0: that bound
    ({0.1: 0, INF: 0}, 0.9, None),                         # no observations
    ({0.1: 3, 1.0: 5}, 0.5, None),                         # negative control: no +Inf bucket (PromQL: NaN)
    ({INF: 5}, 0.5, None),                                 # +Inf alone
    ({}, 0.5, None),
    ({0.1: 1, INF: 2}, 1.5, INF),                          # q outside [0, 1], as PromQL
    ({0.1: 1, INF: 2}, -0.5, -INF),
    ({0.1: 1, INF: math.nan}, 0.5, None),                  # a NaN count holds no rank
])
def test_histogram_quantile(counts, q, expected) -> None:
    got = histogram_quantile(q, counts)
    assert (got is None and expected is None) or got == pytest.approx(expected)


def test_histogram_quantile_agrees_with_a_real_histogram_page() -> None:
    registry = CollectorRegistry()
    h = Histogram("t_seconds", "t", buckets=(0.1, 0.5, 1.0), registry=registry)
    for v in [0.05] * 50 + [0.3] * 40 + [0.8] * 10:
        h.observe(v)
    counts = buckets(samples(generate_latest(registry).decode()), "t_seconds")
    assert histogram_quantile(0.5, counts) == pytest.approx(0.1)
    assert histogram_quantile(0.9, counts) == pytest.approx(0.5)
    assert histogram_quantile(0.95, counts) == pytest.approx(0.75)


@pytest.mark.parametrize("text", [
    "this is { not prometheus",
    "a 1\nfoo bar baz qux\nb 2\n",                          # one garbage line spoils a strict read
    "a abc\n",
    "a\n",
])
def test_garbage_is_metrics_error_when_strict(text) -> None:
    with pytest.raises(MetricsError):
        samples(text)
    with pytest.raises(MetricsError):
        families(text)
    with pytest.raises(MetricsError):
        usable_samples(text)
    assert rejected_values(text) == {}                      # nothing to count: the page is an error


@pytest.mark.parametrize("text,names,bad", [
    (PAGE, None, 0),
    ("a 1\nfoo bar baz qux\nb 2\n", ["a", "b"], 1),
    ("# a comment\n\na 1\nb abc\nc{x=\"1\" 3\nd 4\n", ["a", "d"], 2),
    ("this is { not prometheus", [], 1),
    ("", [], 0),
])
def test_lenient_samples_skip_and_count_bad_lines(text, names, bad) -> None:
    found, skipped = lenient_samples(text)
    assert skipped == bad
    if names is not None:
        assert [s.name for s in found] == names
    else:
        assert found == samples(text)


def test_screen_counts_and_skips_bad_values_never_raises() -> None:
    text = ('a NaN\nb -1\nc +Inf\nd 5\ne{le="NaN"} 1\nf{le="x"} 1\ng{le="+Inf"} 2\n')
    kept, rejected = screen(samples(text))
    assert [s.name for s in kept] == ["d", "g"]
    assert rejected == {NOT_FINITE: 4, NEGATIVE: 1}
    assert rejected_values(text) == rejected
    assert [s.name for s in usable_samples(text)] == ["d", "g"]
    # Negative control: unscreened, every sample (NaN included) is there.
    assert len(samples(text)) == 7 and math.isnan(samples(text)[0].value)


def test_sample_text_round_trips() -> None:
    registry = CollectorRegistry()
    c = Counter("odd", "odd", ["path"], registry=registry)
    c.labels('a "quoted" \\ path\nnext').inc(2)
    page = generate_latest(registry).decode()
    (sample,) = series(samples(page), "odd_total")
    assert sample_text(sample) + " 2.0" in page
    assert samples(sample_text(sample) + " 2\n")[0].labels == sample.labels
    assert sample_text(samples("up 1\n")[0]) == "up"
