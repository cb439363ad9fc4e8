"""The router's Prometheus text -> the planner's signals for one interval (pure).

Histograms are cumulative, so an interval's p90 comes from the difference of two scrapes
(summed over the fleet's router pods and revisions), computed like PromQL's
histogram_quantile. A router that restarted (a count went down) counts from zero.
Gauges are read as they are at the end of the interval.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from pdfleet.contract import metrics as names
from pdfleet.operator.autoscale.planner import RoleSignal
from pdfleet.operator.observability.metrics_text import buckets, histogram_quantile, total, usable_samples

TTFT = names.ROUTER_TTFT
ITL = names.ROUTER_ITL
WAITING = names.ROUTER_LEGS_WAITING
STREAMS = names.ROUTER_STREAMS


@dataclass(frozen=True)
class RouterSample:
    """One scrape of one router: cumulative bucket counts (le -> count) and gauges."""

    ttft: Mapping[float, float] = field(default_factory=dict)
    itl: Mapping[float, float] = field(default_factory=dict)
    prefill_waiting: float = 0.0
    decode_waiting: float = 0.0
    streams: float = 0.0


def parse_router_metrics(text: str) -> RouterSample:
    found = usable_samples(text)
    return RouterSample(ttft=buckets(found, TTFT), itl=buckets(found, ITL),
                        prefill_waiting=total(found, WAITING, **{names.LEG: "prefill"}),
                        decode_waiting=total(found, WAITING, **{names.LEG: "decode"}),
                        streams=total(found, STREAMS))


def went_down(cur: Mapping[float, float], prev: Optional[Mapping[float, float]]) -> bool:
    """A cumulative count lower than in the previous scrape of the same pod."""
    return prev is not None and any(cur.get(le, 0.0) < count for le, count in prev.items())


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
    return {"prefill": RoleSignal(histogram_quantile(0.9, ttft), prefill_load),
            "decode": RoleSignal(histogram_quantile(0.9, itl), decode_load)}
