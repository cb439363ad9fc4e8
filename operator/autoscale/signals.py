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


def metric_samples(text: str) -> list:
    """Every sample of a Prometheus text page; ``MetricsError`` when it is not one."""
    try:
        return [s for family in text_string_to_metric_families(text) for s in family.samples]
    except Exception as exc:  # the parser raises ValueError and others on garbage
        raise MetricsError(f"not Prometheus text: {exc}") from None


def add_bucket(buckets: dict[float, float], sample) -> None:
    """Add a histogram bucket sample to cumulative counts by upper bound (summed over other labels)."""
    le = float(sample.labels["le"])
    buckets[le] = buckets.get(le, 0.0) + sample.value


def _delta(cur: Mapping[float, float], prev: Optional[Mapping[float, float]]) -> dict[float, float]:
    if prev is None or any(cur.get(le, 0.0) < count for le, count in prev.items()):
        return dict(cur)  # first scrape of this router, or it restarted
    return {le: count - prev.get(le, 0.0) for le, count in cur.items()}


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
