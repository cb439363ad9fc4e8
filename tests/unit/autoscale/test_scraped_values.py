"""Scraped values are checked before any decision uses them (issue 30): a NaN, an infinity, a
negative count or a bucket bound that is not a number is counted and skipped, never raised; a
canary step's figures from a page full of them are those of the good series alone."""

from __future__ import annotations

import math

import pytest

from pdfleet.contract import metrics as names
from pdfleet.operator.autoscale.signals import parse_router_metrics
from pdfleet.operator.observability.metrics_text import (
    NEGATIVE, NOT_FINITE, rejected_values, usable_samples, value_problem,
)
from pdfleet.operator.rollout.signals import parse_revision_sample, step_signals

REQ = f"{names.ROUTER_REVISION_REQUESTS}_total"


@pytest.mark.parametrize("value,problem", [
    (0.0, None), (1.0, None), (1e300, None),
    (float("nan"), NOT_FINITE), (float("inf"), NOT_FINITE), (float("-inf"), NOT_FINITE),
    (-1.0, NEGATIVE), (-1e-9, NEGATIVE),
])
def test_value_problem(value: float, problem) -> None:
    assert value_problem(value) == problem


def page(requests: str, errors: str = "0", bucket_le: str = "0.5", bucket: str = "3") -> str:
    return (f"# TYPE {names.ROUTER_REVISION_REQUESTS} counter\n"
            f'{REQ}{{revision="r2",{names.REVISION_OUTCOME}="ok"}} {requests}\n'
            f'{REQ}{{revision="r2",{names.REVISION_OUTCOME}="{names.OUTCOME_5XX}"}} {errors}\n'
            f"# TYPE {names.ROUTER_TTFT} histogram\n"
            f'{names.ROUTER_TTFT}_bucket{{revision="r2",le="{bucket_le}"}} {bucket}\n'
            f'{names.ROUTER_TTFT}_bucket{{revision="r2",le="+Inf"}} 3\n'
            f'{names.ROUTER_TTFT}_count{{revision="r2"}} 3\n'
            f'{names.ROUTER_TTFT}_sum{{revision="r2"}} 0.3\n')


@pytest.mark.parametrize("text,rejected", [
    (page("10"), {}),
    (page("NaN"), {NOT_FINITE: 1}),
    (page("+Inf", errors="-Inf"), {NOT_FINITE: 2}),
    (page("1e6", errors="-5"), {NEGATIVE: 1}),
    (page("10", bucket="NaN"), {NOT_FINITE: 1}),
    (page("10", bucket_le="NaN"), {NOT_FINITE: 1}),
    ("this is { not prometheus", {}),
])
def test_rejected_values_table(text: str, rejected: dict) -> None:
    assert rejected_values(text) == rejected


def test_a_nan_counter_is_skipped_and_the_step_still_decides() -> None:
    base = {"router-a": parse_revision_sample(page("0"), "r2"), "router-b": parse_revision_sample(page("0"), "r2")}
    cur = {"router-a": parse_revision_sample(page("40", errors="20"), "r2"),
           "router-b": parse_revision_sample(page("NaN", errors="NaN"), "r2")}
    signals = step_signals(base, cur)  # before issue 30: ValueError (cannot convert float NaN to integer)
    assert (signals.requests, signals.errors) == (60, 20)  # router-a alone: 40 ok + 20 5xx
    assert all(math.isfinite(s.value) and s.value >= 0 for s in usable_samples(page("NaN", errors="-1")))


def test_router_gauges_are_screened_too() -> None:
    text = (f"# TYPE {names.ROUTER_STREAMS} gauge\n{names.ROUTER_STREAMS}{{revision=\"r\"}} NaN\n"
            f"# TYPE {names.ROUTER_LEGS_WAITING} gauge\n"
            f"{names.ROUTER_LEGS_WAITING}{{{names.LEG}=\"prefill\",revision=\"r\"}} -3\n")
    sample = parse_router_metrics(text)
    assert (sample.streams, sample.prefill_waiting) == (0.0, 0.0)
    assert rejected_values(text) == {NOT_FINITE: 1, NEGATIVE: 1}
