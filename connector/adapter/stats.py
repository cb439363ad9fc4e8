"""Connector stats through vLLM 0.32's connector-stats interface, and their Prometheus metrics.

Workers report counter *increments* since their last report
(``PdfleetConnectorStats.data`` maps a counter name to a number); vLLM aggregates
the workers' reports with ``aggregate`` (sums) and logs ``reduce()``.
``PdfleetPromMetrics`` adds each increment to a Prometheus counter
``vllm:pdfleet_connector_<name>`` (exported as ``..._total``) labelled per engine.
"""

from __future__ import annotations

from typing import Any, Mapping

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats

from pdfleet.connector.adapter.metric_names import COUNTERS, LAYOUT_KEY, METRIC_PREFIX, exported_name
from pdfleet.connector.transfer.layout import KV_CACHE_LAYOUTS

__all__ = ["COUNTERS", "LAYOUT_KEY", "METRIC_PREFIX", "PdfleetConnectorStats", "PdfleetPromMetrics",
           "counter_deltas", "exported_name"]


def counter_deltas(now: Mapping[str, float], before: Mapping[str, float]) -> dict[str, float]:
    """Non-zero increments of the known counters between two cumulative snapshots."""
    out: dict[str, float] = {}
    keys = [*COUNTERS, *(LAYOUT_KEY + name for name in KV_CACHE_LAYOUTS)]
    for key in keys:
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
            seconds = self.data.get("transfer_seconds", 0.0)
            out["avg_transfer_ms"] = round(1000.0 * seconds / done, 3)
            out["avg_descriptors_per_transfer"] = round(self.data.get("descriptors", 0.0) / done, 1)
            if seconds > 0:
                out["gb_per_second"] = round(self.data.get("bytes", 0.0) / seconds / 1e9, 3)
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
        for key, (_, help_text) in COUNTERS.items():
            counter = self._counter_cls(name=exported_name(key), documentation=help_text, labelnames=labelnames)
            self._counters[key] = {
                idx: counter.labels(*values) for idx, values in per_engine_labelvalues.items()
            }
        # Achieved GB/s: rate(vllm:pdfleet_connector_pull_bytes_total) / rate(..._pull_seconds_total).
        by_layout = self._counter_cls(
            name=METRIC_PREFIX + "pulls_by_layout",
            documentation="KV pulls completed, by the physical KV cache layout they read (LBHNC: per layer;"
                          " BLHNC/BHLNC: block-outermost)",
            labelnames=[*labelnames, "layout"],
        )
        for name in KV_CACHE_LAYOUTS:
            self._counters[LAYOUT_KEY + name] = {
                idx: by_layout.labels(*values, name) for idx, values in per_engine_labelvalues.items()
            }
        # The KV transport this pod's fabric preflight verified (or not): an info metric.
        from pdfleet.connector.fabric.exported import read_info_labels

        transport = read_info_labels()
        info = self._gauge_cls(name=METRIC_PREFIX + "kv_transport_info",
                               documentation="KV transport found by the pod's fabric preflight (value 1)",
                               labelnames=[*labelnames, "transport", "status", "reason"],
                               multiprocess_mode="mostrecent")
        for values in per_engine_labelvalues.values():
            info.labels(*values, transport["transport"], transport["status"], transport["reason"]).set(1)

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for key, value in (transfer_stats_data or {}).items():
            per_engine = self._counters.get(key)
            if per_engine is None or engine_idx not in per_engine:
                continue
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
                per_engine[engine_idx].inc(float(value))
