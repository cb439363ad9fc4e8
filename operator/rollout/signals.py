"""The router's Prometheus text -> one revision pair's figures over a canary step (pure).

The router counts every generate request per revision and outcome
(``pdfleet_router_revision_requests``) and keeps TTFT / ITL histograms per revision. A step's
figures are the difference between a scrape at the step's start (the baseline) and now, summed
over the fleet's router pods; a pod that restarted (a count went down) or appeared since counts
from zero. p90s are computed like PromQL's histogram_quantile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional


from pdfleet.contract import metrics as names
from pdfleet.operator.autoscale.signals import add_bucket, metric_samples, quantile
from pdfleet.operator.rollout.canary import Signals

_REVISION = "revision"  # the label the router's per-revision series carry


@dataclass(frozen=True)
class RevisionSample:
    """One scrape of one router, one revision: cumulative counts."""

    requests: float = 0.0
    errors: float = 0.0
    ttft: Mapping[float, float] = field(default_factory=dict)  # le -> cumulative count
    itl: Mapping[float, float] = field(default_factory=dict)


def parse_revision_sample(text: str, revision: str) -> RevisionSample:
    requests = errors = 0.0
    ttft: dict[float, float] = {}
    itl: dict[float, float] = {}
    for s in metric_samples(text):
        if s.labels.get(_REVISION) != revision:
            continue
        if s.name == f"{names.ROUTER_REVISION_REQUESTS}_total":
            requests += s.value
            if s.labels.get(names.REVISION_OUTCOME) == names.OUTCOME_5XX:
                errors += s.value
        elif s.name == f"{names.ROUTER_TTFT}_bucket":
            add_bucket(ttft, s)
        elif s.name == f"{names.ROUTER_ITL}_bucket":
            add_bucket(itl, s)
    return RevisionSample(requests, errors, ttft, itl)


def _restarted(cur: RevisionSample, before: RevisionSample) -> bool:
    return (cur.requests < before.requests or cur.errors < before.errors
            or any(cur.ttft.get(le, 0.0) < n for le, n in before.ttft.items())
            or any(cur.itl.get(le, 0.0) < n for le, n in before.itl.items()))


def step_signals(baseline: Mapping[str, RevisionSample], current: Mapping[str, RevisionSample]) -> Signals:
    """The revision's figures since the baseline, from two scrapes of every router pod (keyed by pod)."""
    requests = errors = 0.0
    ttft: dict[float, float] = {}
    itl: dict[float, float] = {}
    for pod, cur in current.items():
        before: Optional[RevisionSample] = baseline.get(pod)
        if before is None or _restarted(cur, before):
            before = RevisionSample()
        requests += cur.requests - before.requests
        errors += cur.errors - before.errors
        for mine, theirs, out in ((cur.ttft, before.ttft, ttft), (cur.itl, before.itl, itl)):
            for le, n in mine.items():
                out[le] = out.get(le, 0.0) + n - theirs.get(le, 0.0)
    return Signals(requests=int(round(requests)), errors=int(round(errors)),
                   ttft_p90_s=quantile(0.9, ttft), itl_p90_s=quantile(0.9, itl))
