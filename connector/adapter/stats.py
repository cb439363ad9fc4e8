"""Connector stats through vLLM 0.32's connector-stats interface, and their Prometheus metrics.

Workers report counter *increments* since their last report
(``PdfleetConnectorStats.data`` maps a counter name to a number); vLLM aggregates
the workers' reports with ``aggregate`` (sums) and logs ``reduce()``.
``PdfleetPromMetrics`` adds each increment to a Prometheus counter
``vllm:pdfleet_<name>`` (exported as ``..._total``) labelled per engine.
"""

from __future__ import annotations

from typing import Any, Mapping

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

__all__ = ["COUNTERS", "PdfleetConnectorStats", "PdfleetPromMetrics", "counter_deltas"]

# name -> help text. Core counters (connector/transfer) keep their names; the adapter adds its own.
COUNTERS: dict[str, str] = {
    "bytes": "KV bytes pulled by decode",
    "transfers": "KV pulls completed",
    "transfer_seconds": "Seconds from posting a pull's NIXL reads to their completion, summed",
    "post_seconds": "Seconds spent building and posting NIXL reads, summed",
    "descriptors": "NIXL descriptors posted",
    "failures": "KV pulls that failed (the request was recomputed, or failed under kv_load_failure_policy=fail)",
    "handshakes": "Side-channel handshakes completed (decode) or served (prefill)",
    "handshake_failures": "Handshakes that failed on decode's side (timeout, refusal, bad reply)",
    "handshakes_rejected": "Handshakes refused by prefill (compat hash or layout mismatch)",
    "expired_leases": "Pulls that found the prefill lease expired (decode side)",
    "leases_expired": "Leases that expired before decode reported completion (prefill side)",
    "stale_agents_dropped": "Cached NIXL peers dropped because the prefill instance changed or a read failed",
    "messages_rejected": "Malformed or unauthenticated side-channel messages dropped",
    "notifs_rejected": "Malformed completion notifications dropped",
    "params_rejected": "Requests whose kv_transfer_params were invalid (computed locally instead)",
    "blocks_corrupted_for_test": "Pulled blocks overwritten by the test-only fault hook",
}


def counter_deltas(now: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    """Non-zero increments of the known counters between two cumulative snapshots."""
    out: dict[str, float] = {}
    for key in COUNTERS:
        delta = float(now.get(key, 0.0)) - float(before.get(key, 0.0))
        if delta > 0:
            out[key] = delta
    return out


class PdfleetConnectorStats(KVConnectorStats):
    """Counter increments from one or more workers over one interval."""

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for key, value in (other.data or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.data[key] = self.data.get(key, 0.0) + float(value)
        return self

    def reduce(self) -> dict[str, int | float]:
        out: dict[str, int | float] = {k: round(float(v), 6) for k, v in sorted(self.data.items())}
        done = self.data.get("transfers", 0.0)
        if done:
            out["avg_transfer_ms"] = round(1000.0 * self.data.get("transfer_seconds", 0.0) / done, 3)
        return out

    def is_empty(self) -> bool:
        return not any(self.data.values())


class PdfleetPromMetrics(KVConnectorPromMetrics):
    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict,
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters: dict[str, dict[int, Any]] = {}
        for key, help_text in COUNTERS.items():
            counter = self._counter_cls(name=f"vllm:pdfleet_{key}", documentation=help_text, labelnames=labelnames)
            self._counters[key] = {
                idx: counter.labels(*values) for idx, values in per_engine_labelvalues.items()
            }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, value in (transfer_stats_data or {}).items():
            per_engine = self._counters.get(key)
            if per_engine is None or engine_idx not in per_engine:
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                per_engine[engine_idx].inc(float(value))
