"""The router's Prometheus text -> one revision pair's figures over a canary step (pure).

The router counts every generate request per revision and outcome
(``pdfleet_router_revision_requests``) and keeps TTFT / ITL histograms per revision. A step's
figures are the difference between a scrape at the step's start (the baseline) and now, summed
over the fleet's router pods; a pod that appeared since counts from zero, and one whose counts went
down (``went_down``) is rebased by the canary edge first (issue 30: counts only grow within a step).
p90s are computed like PromQL's histogram_quantile.

The recompute figure (``analysis.maxRecomputeRate``) counts requests the pair answered without moving
their KV from its prefill:
- recomputed on decode: the new revision's decode pods' connector counters
  ``vllm:pdfleet_connector_pull_failures_total`` (a pull that failed: recomputed) and
  ``..._params_rejected_total`` (params decode refused: computed locally), window differences summed
  over pods like the router's. Each TP rank of an engine counts them, so the sum is divided by the
  decode's TP size. Decode pods are per revision, which is what ties these counters to the pair.
- decode-only after a KV-path failure: the router's ``pdfleet_router_revision_requests{outcome="kv_fallback"}``
  where the router counts them so (its ``pdfleet_router_fallbacks_total`` has no revision label, so
  it cannot say which pair fell back).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional

from pdfleet.connector.adapter.metric_names import exported_name
from pdfleet.contract import metrics as names
from pdfleet.operator.observability.metrics_text import buckets, histogram_quantile, total, usable_samples
from pdfleet.operator.rollout.canary import Signals

_REVISION = "revision"  # the label the router's per-revision series carry


@dataclass(frozen=True)
class RevisionSample:
    """One scrape of one router, one revision: cumulative counts."""

    requests: float = 0.0
    errors: float = 0.0
    ttft: Mapping[float, float] = field(default_factory=dict)  # le -> cumulative count
    itl: Mapping[float, float] = field(default_factory=dict)
    fallbacks: float = 0.0  # answered by decode alone after a KV-path failure (the outcome kv_fallback)


def parse_revision_sample(text: str, revision: str) -> RevisionSample:
    found = usable_samples(text)
    mine = {_REVISION: revision}
    requests = f"{names.ROUTER_REVISION_REQUESTS}_total"
    return RevisionSample(
        requests=total(found, requests, **mine),
        errors=total(found, requests, **mine, **{names.REVISION_OUTCOME: names.OUTCOME_5XX}),
        ttft=buckets(found, names.ROUTER_TTFT, **mine),
        itl=buckets(found, names.ROUTER_ITL, **mine),
        fallbacks=total(found, requests, **mine, **{names.REVISION_OUTCOME: names.OUTCOME_FALLBACK}))


# Decode-side connector counters whose requests were computed locally instead of pulled.
RECOMPUTE_COUNTERS = tuple(f"{exported_name(key)}_total" for key in ("failures", "params_rejected"))


def parse_decode_recomputed(text: str) -> float:
    """One decode pod's cumulative count of recomputed requests (every rank's count, summed)."""
    return total(usable_samples(text), *RECOMPUTE_COUNTERS)


def decode_recomputed(baseline: Mapping[str, float], current: Mapping[str, float], ranks: int) -> float:
    """Recomputed requests since the baseline over a revision's decode pods (keyed by pod); a pod that
    restarted (its count went down) or appeared since counts from zero; ``ranks``: decode's TP size."""
    total = 0.0
    for pod, cur in current.items():
        before = baseline.get(pod, 0.0)
        total += cur - (before if before <= cur else 0.0)
    return total / max(1, ranks)


def _restarted(cur: RevisionSample, before: RevisionSample) -> bool:
    return (cur.requests < before.requests or cur.errors < before.errors or cur.fallbacks < before.fallbacks
            or any(cur.ttft.get(le, 0.0) < n for le, n in before.ttft.items())
            or any(cur.itl.get(le, 0.0) < n for le, n in before.itl.items()))


def went_down(baseline: Mapping[str, RevisionSample], current: Mapping[str, RevisionSample]) -> list[str]:
    """Router pods whose counts went down since the step's baseline (a restart, or figures that are
    not counters): the edge skips what they counted before and takes their current figures as their
    new baseline, so that a step's figures only ever grow (issue 30)."""
    return sorted(pod for pod, cur in current.items() if pod in baseline and _restarted(cur, baseline[pod]))


def step_signals(baseline: Mapping[str, RevisionSample], current: Mapping[str, RevisionSample],
                 recomputed: Optional[float] = None) -> Signals:
    """The revision's figures since the baseline, from two scrapes of every router pod (keyed by pod);
    ``recomputed``: decode's count over the same window (``decode_recomputed``), None: not measured
    (then the router's decode-only count alone is not a recompute figure either)."""
    requests = errors = fallbacks = 0.0
    ttft: dict[float, float] = {}
    itl: dict[float, float] = {}
    for pod, cur in current.items():
        before: Optional[RevisionSample] = baseline.get(pod)
        if before is None or _restarted(cur, before):
            before = RevisionSample()
        requests += cur.requests - before.requests
        errors += cur.errors - before.errors
        fallbacks += cur.fallbacks - before.fallbacks
        for mine, theirs, out in ((cur.ttft, before.ttft, ttft), (cur.itl, before.itl, itl)):
            for le, n in mine.items():
                out[le] = out.get(le, 0.0) + n - theirs.get(le, 0.0)
    return Signals(requests=int(round(requests)), errors=int(round(errors)),
                   ttft_p90_s=histogram_quantile(0.9, ttft), itl_p90_s=histogram_quantile(0.9, itl),
                   recomputed=None if recomputed is None else recomputed + fallbacks)
