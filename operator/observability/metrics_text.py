"""Prometheus exposition text, read in one place for the whole operator (pure).

- Parsing is prometheus_client's (`text_string_to_metric_families`): ``families`` / ``samples`` raise
  ``MetricsError`` on a page that is not exposition text; ``lenient_samples`` skips the lines that
  do not parse and counts them (the smoke report shows what it can of a damaged page).
- ``screen`` is issue 30's rule for values a decision reads from a router: a NaN, an infinity, a
  negative count or a bucket bound that is not a number is counted and skipped, never raised.
- ``total`` / ``total_by`` sum a series over label filters; ``buckets`` and ``histogram_quantile``
  compute PromQL's histogram_quantile over cumulative bucket counts.

Used by autoscale (the planner's signals), rollout (canary analysis), local (the smoke report and
warm-up) and the dashboard evaluator.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Optional

from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

__all__ = [
    "MetricsError", "NOT_FINITE", "NEGATIVE", "WENT_DOWN", "Sample", "families", "samples", "lenient_samples",
    "sample_text",
    "value_problem", "screen", "usable_samples", "rejected_values", "total", "total_by", "add_bucket", "buckets",
    "histogram_quantile", "series",
]

# Why a scraped value was skipped: the label values of the operator's scraped_values_rejected counter.
NOT_FINITE, NEGATIVE, WENT_DOWN = "not_finite", "negative", "went_down"


class MetricsError(ValueError):
    """The text is not Prometheus exposition format."""


def families(text: str) -> list:
    """Every metric family of a page (name, type, samples); ``MetricsError`` when it is not one."""
    try:
        return list(text_string_to_metric_families(text))
    except Exception as exc:  # the parser raises ValueError and others on garbage
        raise MetricsError(f"not Prometheus text: {exc}") from None


def samples(text: str) -> list[Sample]:
    """Every sample of a page, as written (no value checked); ``MetricsError`` when it is not one."""
    return [s for family in families(text) for s in family.samples]


def lenient_samples(text: str) -> tuple[list[Sample], int]:
    """(the samples of the lines that parse, how many sample lines did not): one bad line costs itself."""
    try:
        return samples(text), 0
    except MetricsError:
        pass
    kept: list[Sample] = []
    bad = 0
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        try:
            kept.extend(samples(line + "\n"))
        except MetricsError:
            bad += 1
    return kept, bad


def sample_text(s: Sample) -> str:
    """A sample's name and labels as exposition text writes them (for showing a series)."""
    if not s.labels:
        return s.name
    escaped = (v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"') for v in s.labels.values())
    return s.name + "{" + ",".join(f'{k}="{v}"' for k, v in zip(s.labels, escaped)) + "}"


def value_problem(value: float) -> Optional[str]:
    """Why a scraped count or gauge cannot be used, or None: every series the operator reads from a
    router counts something (requests, bucketed observations, legs, streams)."""
    if not math.isfinite(value):
        return NOT_FINITE
    if value < 0:
        return NEGATIVE
    return None


def screen(found: Iterable[Sample]) -> tuple[list[Sample], dict[str, int]]:
    """(the usable samples, how many were skipped per reason); never raises."""
    kept, rejected = [], {}
    for s in found:
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


def usable_samples(text: str) -> list[Sample]:
    """Every sample of a page that passes ``screen`` (no NaN, infinity or negative count reaches a
    decision); ``MetricsError`` when the page is not Prometheus text."""
    return screen(samples(text))[0]


def rejected_values(text: str) -> dict[str, int]:
    """What ``usable_samples`` skips on this page, by reason (the edges count it); {} on garbage."""
    try:
        return screen(samples(text))[1]
    except MetricsError:
        return {}


def _matches(s: Sample, names: Iterable[str], labels: Mapping[str, str]) -> bool:
    return s.name in names and all(s.labels.get(k) == v for k, v in labels.items())


def series(found: Iterable[Sample], name: str, **labels: str) -> list[Sample]:
    """The samples named ``name`` whose labels include ``labels``."""
    return [s for s in found if _matches(s, (name,), labels)]


def total(found: Iterable[Sample], *names: str, **labels: str) -> float:
    """The sum of every series named one of ``names`` whose labels include ``labels`` (0 when none)."""
    return float(sum(s.value for s in found if _matches(s, names, labels)))


def total_by(found: Iterable[Sample], name: str, label: str, default: Optional[str] = None,
             **labels: str) -> dict[str, float]:
    """{value of ``label``: sum} over the series named ``name`` whose labels include ``labels``; a series
    without ``label`` counts under ``default``, or not at all when it is None."""
    out: dict[str, float] = {}
    for s in found:
        if not _matches(s, (name,), labels):
            continue
        key = s.labels.get(label, default)
        if key is not None:
            out[key] = out.get(key, 0.0) + s.value
    return out


def add_bucket(counts: dict[float, float], sample: Sample) -> None:
    """Add a ``_bucket`` sample to cumulative counts by upper bound (summed over its other labels)."""
    le = float(sample.labels["le"])
    counts[le] = counts.get(le, 0.0) + sample.value


def buckets(found: Iterable[Sample], histogram: str, **labels: str) -> dict[float, float]:
    """A histogram's cumulative counts by upper bound, summed over the series whose labels include ``labels``."""
    out: dict[float, float] = {}
    for s in series(found, histogram + "_bucket", **labels):
        add_bucket(out, s)
    return out


def histogram_quantile(q: float, counts: Mapping[float, float]) -> Optional[float]:
    """PromQL's histogram_quantile over cumulative counts by upper bound: linear inside the bucket
    holding the rank (from 0 for the first); in the +Inf bucket, the last finite bound; in a first
    bucket bounded at or below 0, that bound. None where PromQL gives NaN: no +Inf bucket, fewer than
    two buckets, or no observations; -inf / +inf for q below 0 / above 1."""
    ordered = sorted(counts.items())
    if len(ordered) < 2 or not math.isinf(ordered[-1][0]) or ordered[-1][1] <= 0:
        return None
    if q < 0 or q > 1:
        return math.copysign(math.inf, q)
    rank = q * ordered[-1][1]
    lower_le, lower_count = 0.0, 0.0
    for i, (le, count) in enumerate(ordered):
        if count >= rank:
            if math.isinf(le):
                return lower_le
            if i == 0 and le <= 0:
                return le
            width = count - lower_count
            return lower_le + (le - lower_le) * ((rank - lower_count) / width if width > 0 else 1.0)
        lower_le, lower_count = le, count
    return None  # a NaN count: no bucket holds the rank
