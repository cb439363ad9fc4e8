"""Metric naming rules every pdfleet metric follows (pure): checked over all registries by
tests/unit/observability/test_metric_names.py, so a metric added later is held to them too."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable

PREFIX = re.compile(r"^(vllm:)?pdfleet_(operator|router|connector)_[a-z][a-z0-9_]*[a-z0-9]$")
# Labels whose values grow without bound: one series per request or per user.
UNBOUNDED_LABELS = {"request_id", "req_id", "id", "uuid", "trace_id", "prompt", "user", "remote_request_id"}
TIME_WORDS = ("latency", "duration", "time", "seconds", "elapsed")


@dataclass(frozen=True)
class Family:
    name: str            # as prometheus_client names the family (a counter without `_total`)
    type: str            # counter, gauge, histogram, summary, info
    labels: tuple[str, ...] = ()


def naming_problems(families: Iterable[Family]) -> list[str]:
    out = []
    seen: dict[tuple[str, ...], str] = {}
    for f in families:
        name = f.name
        if not PREFIX.match(name):
            out.append(f"{name}: want pdfleet_<operator|router|connector>_<name> (vllm: allowed), lower case")
        if name.endswith("_total"):
            out.append(f"{name}: a family name ends without _total (counters get it on export)")
        if f.type != "counter" and name.endswith(("_count", "_sum", "_bucket")):
            out.append(f"{name}: suffix reserved for histogram series")
        if any(w in name for w in TIME_WORDS) and not name.endswith("_seconds"):
            out.append(f"{name}: a duration is in seconds and ends with _seconds")
        if re.search(r"_(ms|millis|milliseconds|us|ns|minutes|hours)(_|$)", name):
            out.append(f"{name}: use base units (seconds)")
        if "bytes" in name and not name.endswith("_bytes"):
            out.append(f"{name}: a size is in bytes and ends with _bytes")
        if re.search(r"_(kb|mb|gb|kib|mib|gib)(_|$)", name):
            out.append(f"{name}: use base units (bytes)")
        if f.type == "info" or name.endswith("_info"):
            if f.type not in ("gauge", "info"):
                out.append(f"{name}: an _info series is a gauge of 1")
        for label in f.labels:
            if label in UNBOUNDED_LABELS:
                out.append(f"{name}: label {label!r} is unbounded (one series per request)")
        words = tuple(sorted(name.split(":")[-1].split("_")))
        if words in seen and seen[words] != name:
            out.append(f"{name}: the same words as {seen[words]} (two names for one thing?)")
        seen.setdefault(words, name)
    return out
