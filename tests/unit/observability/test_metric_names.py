"""Every metric the operator, the router and the connector define follows the naming rules."""

from __future__ import annotations

import pytest

from pdfleet.operator.observability.names import Family, naming_problems


def registry_families(registry):
    out = []
    for metric in registry.collect():
        labels = set()
        for collector in list(registry._collector_to_names):
            if getattr(collector, "_name", None) == metric.name:
                labels |= set(getattr(collector, "_labelnames", ()))
        out.append(Family(metric.name, metric.type, tuple(sorted(labels))))
    return out


def all_families():
    from pdfleet.connector.adapter.metric_names import COUNTERS, exported_name
    from pdfleet.connector.serving.metrics import RouterMetrics
    from pdfleet.operator.reconcile.metrics import OperatorMetrics

    families = registry_families(OperatorMetrics().registry) + registry_families(RouterMetrics().registry)
    families += [Family(exported_name(key), "counter", ("engine", "model_name")) for key in COUNTERS]
    return families


def test_every_pdfleet_metric_follows_the_rules():
    families = all_families()
    names = {f.name for f in families}
    assert len(families) >= 30 and len(names) == len(families)
    assert {"pdfleet_operator_fleet_replicas", "pdfleet_router_requests",
            "vllm:pdfleet_connector_pull_bytes"} <= names
    assert naming_problems(families) == []


@pytest.mark.parametrize("family, problem", [
    (Family("pdfleet_reconciles", "counter"), "want pdfleet_<operator|router|connector>"),
    (Family("vllm:pdfleet_bytes", "counter"), "want pdfleet_<operator|router|connector>"),
    (Family("pdfleet_router_leg_latency_ms", "histogram"), "_seconds"),
    (Family("pdfleet_connector_pull_time", "counter"), "_seconds"),
    (Family("pdfleet_connector_pulled_bytes_mb", "counter"), "_bytes"),
    (Family("pdfleet_router_requests_total", "counter"), "ends without _total"),
    (Family("pdfleet_router_requests", "counter", ("request_id",)), "unbounded"),
    (Family("pdfleet_router_Requests", "counter"), "lower case"),
])
def test_rules_catch_bad_names(family, problem):
    problems = naming_problems([family])
    assert any(problem in p for p in problems), problems


def test_two_names_for_one_thing_are_caught():
    # The duplicate this release removed: expired_leases (decode) and leases_expired (prefill).
    problems = naming_problems([Family("vllm:pdfleet_connector_expired_leases", "counter"),
                                Family("vllm:pdfleet_connector_leases_expired", "counter")])
    assert problems == ["vllm:pdfleet_connector_leases_expired: the same words as "
                        "vllm:pdfleet_connector_expired_leases (two names for one thing?)"]
