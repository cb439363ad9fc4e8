"""The `pdfleet local --smoke` report: one row per engine from its /metrics page (pure).

Columns: requests finished, prompt tokens by source (computed locally, hit in the local
prefix cache, pulled by KV transfer), KV bytes pulled and the pull throughput (bytes over
the time the pulls took, from posting the NIXL reads to their completion), and failures
(pulls and handshakes that failed, handshakes refused). `--metrics-raw` prints the raw lines.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Optional

from pdfleet.contract.metrics import ROUTER_DISAGGREGATION_DECISIONS
from pdfleet.contract.routing import DECODE_ONLY
from pdfleet.operator.observability.metrics_text import samples, total, total_by

CONNECTOR = "vllm:pdfleet_connector_"
FAILURE_COUNTERS = ("pull_failures", "handshake_failures", "handshakes_rejected")
# vLLM 0.32's sources of prompt tokens, in the order shown.
SOURCES = (("local_compute", "computed"), ("local_cache_hit", "cached"), ("external_kv_transfer", "by KV"))


@dataclass(frozen=True)
class EngineFigures:
    name: str
    role: str
    available: bool = True
    requests: float = 0.0
    tokens: dict[str, float] = field(default_factory=dict)   # source -> prompt tokens
    kv_bytes: float = 0.0
    kv_seconds: float = 0.0
    pulls: float = 0.0
    failures: float = 0.0

    @property
    def gb_per_s(self) -> Optional[float]:
        return self.kv_bytes / self.kv_seconds / 1e9 if self.kv_seconds > 0 else None


def engine_figures(name: str, role: str, text: Optional[str]) -> EngineFigures:
    if text is None:
        return EngineFigures(name, role, available=False)
    found = samples(text)
    return EngineFigures(
        name, role,
        requests=total(found, "vllm:request_success_total"),
        tokens=total_by(found, "vllm:prompt_tokens_by_source_total", "source", default=""),
        kv_bytes=total(found, CONNECTOR + "pull_bytes_total"),
        kv_seconds=total(found, CONNECTOR + "pull_seconds_total"),
        pulls=total(found, CONNECTOR + "pulls_total"),
        failures=sum(total(found, CONNECTOR + c + "_total") for c in FAILURE_COUNTERS),
    )


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")


def format_table(rows: Iterable[EngineFigures], router_text: Optional[str] = None) -> list[str]:
    """Aligned lines: a header, one row per engine, and the router's request counts."""
    header = ["engine", "role", "requests"] + [f"prompt {label}" for _, label in SOURCES] + \
             ["KV pulled", "pulls", "GB/s", "failures"]
    table = [header]
    for r in rows:
        if not r.available:
            table.append([r.name, r.role, "/metrics unavailable"])
            continue
        rate = r.gb_per_s
        table.append([r.name, r.role, f"{r.requests:.0f}"] + [f"{r.tokens.get(s, 0):.0f}" for s, _ in SOURCES] +
                     [human_bytes(r.kv_bytes), f"{r.pulls:.0f}", "-" if rate is None else f"{rate:.2f}",
                      f"{r.failures:.0f}"])
    widths = [max(len(row[i]) for row in table if i < len(row)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(widths[i]) if i < 2 else cell.rjust(widths[i])
                       for i, cell in enumerate(row)).rstrip() for row in table]
    if router_text is not None:
        found = samples(router_text)
        by_code = total_by(found, "pdfleet_router_requests_total", "code", default="?")
        codes = ", ".join(f"{c}: {v:.0f}" for c, v in sorted(by_code.items())) or "none"
        fallbacks = total(found, "pdfleet_router_fallbacks_total")
        retries = total(found, "pdfleet_router_retries_total")
        line = f"router: requests by code {codes}; fallbacks {fallbacks:.0f}; retries {retries:.0f}"
        # Conditional disaggregation: requests decode served alone by choice (n > 1 is among the fallbacks
        # already), so that decode's requests = prefill's + fallbacks + these
        decisions = total_by(found, ROUTER_DISAGGREGATION_DECISIONS + "_total", "reason", default="",
                             decision=DECODE_ONLY)
        if decisions:
            chosen = sum(v for reason, v in decisions.items() if reason != "fan_out")
            line += f"; decode alone by choice {chosen:.0f}"
        lines.append(line)
    return lines
