"""The connector exports the transport its pod's preflight verified as an info metric."""

from __future__ import annotations

import json
import types

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pdfleet.connector.adapter.stats import PdfleetPromMetrics


def build(registry: CollectorRegistry) -> PdfleetPromMetrics:
    def gauge(*a, **kw):
        kw.pop("multiprocess_mode", None)
        return Gauge(*a, registry=registry, **kw)

    def counter(*a, **kw):
        return Counter(*a, registry=registry, **kw)

    cfg = types.SimpleNamespace(kv_transfer_config=None)
    return PdfleetPromMetrics(cfg, {Gauge: gauge, Counter: counter, Histogram: Histogram}, ["engine"], {0: ["0"]})


def test_info_metric_names_the_transport(tmp_path, monkeypatch) -> None:
    path = tmp_path / "kv-transport.json"
    path.write_text(json.dumps({"status": "True", "reason": "TransportVerified", "transport": "rc_mlx5/mlx5_0:1"}))
    monkeypatch.setenv("PDFLEET_KV_TRANSPORT_FILE", str(path))
    registry = CollectorRegistry()
    build(registry)
    labels = {"engine": "0", "transport": "rc_mlx5", "status": "True", "reason": "TransportVerified"}
    assert registry.get_sample_value("vllm:pdfleet_connector_kv_transport_info", labels) == 1.0
    assert registry.get_sample_value("vllm:pdfleet_connector_kv_transport_info", {**labels, "transport": "tcp"}) is None
