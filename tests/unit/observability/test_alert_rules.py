"""The chart's PrometheusRule validates against the Prometheus Operator's CRD schema (vendored
in vendor/, see SOURCE.md), made strict, and its expressions parse."""

from __future__ import annotations

import copy
from pathlib import Path

import helm_python
import jsonschema
import pytest
import yaml
from observability_assets import CHART, prometheus_rule

from pdfleet.operator.observability.promql import parse, rule_queries

CRD = Path(__file__).parent / "vendor" / "monitoring.coreos.com_prometheusrules.yaml"


def strict(schema):
    """The CRD's schema with unknown fields refused: the API server would prune them silently,
    so a misspelled `for` would quietly make an alert fire at once."""
    schema = copy.deepcopy(schema)
    if isinstance(schema, dict):
        if "properties" in schema and schema.get("type") == "object" and schema["properties"]:
            schema.setdefault("additionalProperties", False)
        for key, value in list(schema.items()):
            if key == "metadata":
                continue
            schema[key] = strict(value)
    elif isinstance(schema, list):
        schema = [strict(v) for v in schema]
    return schema


def validator():
    crd = yaml.safe_load(CRD.read_text())
    (version,) = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return jsonschema.Draft7Validator(strict(version["schema"]["openAPIV3Schema"]))


def errors(doc):
    return sorted(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator().iter_errors(doc))


def test_prometheus_rule_validates_against_the_crd_schema():
    rule = prometheus_rule()
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert errors(rule) == []


@pytest.mark.parametrize("breakage, where", [
    (lambda r: r["spec"]["groups"][0]["rules"][0].update({"for": "ten minutes"}), "spec/groups/0/rules/0/for"),
    (lambda r: r["spec"]["groups"][0]["rules"][0].update({"fro": "5m"}), "spec/groups/0/rules/0"),
    (lambda r: r["spec"]["groups"][0]["rules"][0].pop("expr"), "spec/groups/0/rules/0"),
    (lambda r: r["spec"]["groups"][0].pop("name"), "spec/groups/0"),
])
def test_schema_check_catches_breakage(breakage, where):
    rule = prometheus_rule()
    breakage(rule)
    assert any(e.startswith(where + ":") for e in errors(rule)), errors(rule)


def test_alerts_and_their_expressions():
    rule = prometheus_rule()
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) == {"PdfleetKVPullFailures", "PdfleetKVLeasesExpired", "PdfleetKVHandshakesRejected",
                           "PdfleetFallbackShareHigh", "PdfleetFleetNotReady", "PdfleetKVTransportDegraded"}
    for where, expr in rule_queries(rule):
        parse(expr)
        assert "by (namespace, fleet)" in expr, where  # one alert per fleet
    assert alerts["PdfleetFleetNotReady"]["for"] == "15m"
    assert alerts["PdfleetFallbackShareHigh"]["expr"].rstrip().endswith("> 0.05")
    assert 'reason!="fan_out"' in alerts["PdfleetFallbackShareHigh"]["expr"]  # n > 1 is the client's choice
    assert 'type="KVTransport", status="false"' in alerts["PdfleetKVTransportDegraded"]["expr"]
    for alert in alerts.values():
        assert alert["labels"]["severity"] in {"warning", "critical"}
        assert "{{ $labels.fleet }}" in alert["annotations"]["summary"]  # Prometheus templates survive Helm


def test_thresholds_come_from_values_and_the_rule_is_off_by_default():
    chart = helm_python.Chart.load(str(CHART))
    assert not [p for p in chart.render({}, name="pdfleet", namespace="x") if p.endswith("prometheusrule.yaml")
                and chart.render({}, name="pdfleet", namespace="x")[p].strip()]
    values = {"metrics": {"prometheusRule": {"enabled": True, "fallbackShare": 0.2, "notReadyFor": "30m",
                                             "labels": {"release": "kube-prometheus"}}}}
    text = next(t for p, t in chart.render(values, name="pdfleet", namespace="x").items()
                if p.endswith("prometheusrule.yaml"))
    rule = yaml.safe_load(text)
    alerts = {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}
    assert alerts["PdfleetFallbackShareHigh"]["expr"].rstrip().endswith("> 0.2")
    assert alerts["PdfleetFleetNotReady"]["for"] == "30m"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus"
    assert errors(rule) == []
