"""The router's Prometheus text -> the planner's signals for one interval (pure).

Histograms are cumulative, so an interval's p90 comes from the difference of two scrapes
(summed over the fleet's router pods and revisions), computed like PromQL's
histogram_quantile. A router that restarted (a count went down) counts from zero.
Gauges are read as they are at the end of the interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional

from prometheus_client.parser import text_string_to_metric_families

from pdfleet.contract import metrics as names
from pdfleet.operator.autoscale.planner import RoleSignal

TTFT = names.ROUTER_TTFT
ITL = names.ROUTER_ITL
WAITING = names.ROUTER_LEGS_WAITING
STREAMS = names.ROUTER_STREAMS


class MetricsError(ValueError):
    """The text is not Prometheus exposition format."""


@dataclass(frozen=True)
class RouterSample:
    """One scrape of one router: cumulative bucket counts (le -> count) and gauges."""

    ttft: Mapping[float, float] = field(default_factory=dict)
    itl: Mapping[float, float] = field(default_factory=dict)
    prefill_waiting: float = 0.0
    decode_waiting: float = 0.0
    streams: float = 0.0


def parse_router_metrics(text: str) -> RouterSample:
    ttft: dict[float, float] = {}
    itl: dict[float, float] = {}
    waiting = {"prefill": 0.0, "decode": 0.0}
    streams = 0.0
    for s in metric_samples(text):
        if s.name == f"{TTFT}_bucket":
            add_bucket(ttft, s)
        elif s.name == f"{ITL}_bucket":
            add_bucket(itl, s)
        elif s.name == WAITING and s.labels.get(names.LEG) in waiting:
            waiting[s.labels[names.LEG]] += s.value
        elif s.name == STREAMS:
            streams += s.value
    return RouterSample(ttft, itl, waiting["prefill"], waiting["decode"], streams)


def _all_samples(text: str) -> list:
    try:
        return [s for family in text_string_to_metric_families(text) for s in family.samples]
    except Exception as exc:  # the parser raises ValueError and others on garbage
        raise MetricsError(f"not Prometheus text: {exc}") from None


def metric_samples(text: str) -> list:
    """Every usable sample of a Prometheus text page (``screen``: no NaN, infinity or negative
    count reaches a decision); ``MetricsError`` when it is not one."""
    return screen(_all_samples(text))[0]


def rejected_values(text: str) -> dict[str, int]:
    """What ``metric_samples`` skips on this page, by reason (the edges count it); {} on garbage."""
    try:
        return screen(_all_samples(text))[1]
    except MetricsError:
        return {}


NOT_FINITE, NEGATIVE, WENT_DOWN = "not_finite", "negative", "went_down"


def value_problem(value: float) -> Optional[str]:
    """Why a scraped count or gauge cannot be used, or None: every series the operator reads from a
    router counts something (requests, bucketed observations, legs, streams)."""
    if not math.isfinite(value):
        return NOT_FINITE
    if value < 0:
        return NEGATIVE
    return None


def screen(samples: list) -> tuple[list, dict[str, int]]:
    """(the usable samples, how many were skipped per reason); never raises."""
    kept, rejected = [], {}
    for s in samples:
        problem = value_problem(s.value)
        if problem is None and "le" in s.labels:  # a bucket bound: "+Inf" is one, "NaN" or garbage is not
            try:
                problem = None if not math.isnan(float(s.labels["le"])) else NOT_FINITE
            except ValueError:
                problem = NOT_FINITE
        if problem is None:
            kept.append(s)
        else:
            rejected[problem] = rejected.get(problem, 0) + 1
    return kept, rejected


def went_down(cur: Mapping[float, float], prev: Optional[Mapping[float, float]]) -> bool:
    """A cumulative count lower than in the previous scrape of the same pod."""
    return prev is not None and any(cur.get(le, 0.0) < count for le, count in prev.items())


def add_bucket(buckets: dict[float, float], sample) -> None:
    """Add a histogram bucket sample to cumulative counts by upper bound (summed over other labels)."""
    le = float(sample.labels["le"])
    buckets[le] = buckets.get(le, 0.0) + sample.value


def _delta(cur: Mapping[float, float], prev: Optional[Mapping[float, float]]) -> dict[float, float]:
    if prev is None:
        return dict(cur)  # first scrape of this router
    if went_down(cur, prev):
        return {}  # not monotonic (a restart, or a made-up page): skipped this interval (interval_went_down)
    return {le: count - prev.get(le, 0.0) for le, count in cur.items()}


def interval_went_down(prev: Mapping[str, RouterSample], cur: Mapping[str, RouterSample]) -> list[str]:
    """Router pods whose histogram counts went down since the previous scrape: their interval is skipped."""
    return sorted(pod for pod, s in cur.items() if (b := prev.get(pod)) is not None
                  and (went_down(s.ttft, b.ttft) or went_down(s.itl, b.itl)))


def quantile(q: float, buckets: Mapping[float, float]) -> Optional[float]:
    """histogram_quantile over cumulative buckets; None when empty."""
    ordered = sorted(buckets.items())
    if not ordered or ordered[-1][1] <= 0:
        return None
    total = ordered[-1][1]
    rank = q * total
    lower_le, lower_count = 0.0, 0.0
    for le, count in ordered:
        if count >= rank:
            if math.isinf(le):
                return lower_le  # beyond the last finite bucket: its bound, as PromQL does
            width = count - lower_count
            return lower_le + (le - lower_le) * ((rank - lower_count) / width if width > 0 else 1.0)
        lower_le, lower_count = le, count
    return ordered[-1][0]


def interval_signals(prev: Mapping[str, RouterSample], cur: Mapping[str, RouterSample]) -> dict[str, RoleSignal]:
    """Signals per role from two scrapes of every router pod (keyed by pod)."""
    ttft: dict[float, float] = {}
    itl: dict[float, float] = {}
    for pod, sample in cur.items():
        before = prev.get(pod)
        for le, n in _delta(sample.ttft, before.ttft if before else None).items():
            ttft[le] = ttft.get(le, 0.0) + n
        for le, n in _delta(sample.itl, before.itl if before else None).items():
            itl[le] = itl.get(le, 0.0) + n
    prefill_load = sum(s.prefill_waiting for s in cur.values())
    decode_load = sum(s.streams + s.decode_waiting for s in cur.values())
    return {"prefill": RoleSignal(quantile(0.9, ttft), prefill_load),
            "decode": RoleSignal(quantile(0.9, itl), decode_load)}
