"""The Grafana dashboard: one JSON in docs/ and in the chart, valid against Grafana's dashboard
schema (grafana-foundation-sdk's models, generated from Grafana's own schema) and the fields
Grafana needs, every query valid PromQL, and the chart ships it only when asked."""

from __future__ import annotations

import copy
import importlib.util
import json

import helm_python
import pytest
import yaml
from observability_assets import CHART, DASHBOARD, DOCS_DASHBOARD, REPO, load_dashboard

from pdfleet.operator.observability.promql import dashboard_queries, parse


def test_docs_and_chart_copies_are_the_generated_dashboard():
    spec = importlib.util.spec_from_file_location("build_dashboard", REPO / "docs" / "dashboards" / "build_dashboard.py")
    builder = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(builder)
    generated = json.dumps(builder.build(), indent=2) + "\n"
    assert DASHBOARD.read_text() == generated, "run python docs/dashboards/build_dashboard.py"
    assert DOCS_DASHBOARD.read_text() == generated, "run python docs/dashboards/build_dashboard.py"


def lost_fields(original, decoded, path=""):
    """Fields of `original` that Grafana's schema models dropped or changed on decode + encode."""
    out = []
    if isinstance(original, dict):
        for key, value in original.items():
            if key not in decoded:
                out.append(f"{path}/{key}")
            else:
                out += lost_fields(value, decoded[key], f"{path}/{key}")
    elif isinstance(original, list):
        if len(original) != len(decoded):
            return [f"{path} (length)"]
        for i, (a, b) in enumerate(zip(original, decoded)):
            out += lost_fields(a, b, f"{path}[{i}]")
    elif original != decoded:
        out.append(f"{path} ({original!r} -> {decoded!r})")
    return out


def through_grafana_schema(dashboard):
    from grafana_foundation_sdk.cog import plugins
    from grafana_foundation_sdk.models.dashboard import Dashboard

    plugins.register_default_plugins()
    model = Dashboard.from_json(copy.deepcopy(dashboard))
    return json.loads(json.dumps(model.to_json(), default=lambda o: o.to_json() if hasattr(o, "to_json") else str(o)))


def test_every_field_is_one_of_grafanas_dashboard_schema():
    dashboard = load_dashboard()
    assert lost_fields(dashboard, through_grafana_schema(dashboard)) == []


def test_a_misspelled_field_is_caught_by_the_schema_check():
    # Negative control: a field Grafana's schema does not have is dropped, and the check sees it.
    dashboard = load_dashboard()
    dashboard["panels"][1]["gridpos"] = dashboard["panels"][1].pop("gridPos")
    assert lost_fields(dashboard, through_grafana_schema(dashboard)) == ["/panels[1]/gridpos"]


def required_field_problems(dashboard):
    """What Grafana needs to import and lay out a dashboard (checked independently of the models)."""
    problems = []
    for key, kind in (("title", str), ("uid", str), ("schemaVersion", int), ("panels", list), ("templating", dict)):
        if not isinstance(dashboard.get(key), kind):
            problems.append(f"{key}: missing or not {kind.__name__}")
    if not 1 <= len(dashboard.get("uid") or "") <= 40:
        problems.append("uid: 1..40 characters")
    ids = [p.get("id") for p in dashboard.get("panels") or []]
    if len(set(ids)) != len(ids) or not all(isinstance(i, int) for i in ids):
        problems.append("panels: ids must be unique integers")
    for p in dashboard.get("panels") or []:
        g = p.get("gridPos") or {}
        if not all(isinstance(g.get(k), int) for k in "hwxy") or g["x"] + g["w"] > 24:
            problems.append(f"panel {p.get('title')!r}: gridPos h, w, x, y within 24 columns")
        if not p.get("type") or not p.get("title"):
            problems.append(f"panel {p.get('id')}: type and title")
        if p.get("type") != "row":
            refs = [t.get("refId") for t in p.get("targets") or []]
            if not refs or len(set(refs)) != len(refs):
                problems.append(f"panel {p.get('title')!r}: targets with unique refIds")
    names = [v.get("name") for v in (dashboard.get("templating") or {}).get("list") or []]
    for var in ("datasource", "namespace", "fleet"):
        if var not in names:
            problems.append(f"templating: variable {var!r}")
    return problems


def test_required_fields_and_layout():
    dashboard = load_dashboard()
    assert required_field_problems(dashboard) == []
    rows = [p["title"] for p in dashboard["panels"] if p["type"] == "row"]
    assert rows == ["Serving", "KV transfer", "Engines", "Fleet"]


@pytest.mark.parametrize("breakage, problem", [
    (lambda d: d.pop("uid"), "uid: missing or not str"),
    (lambda d: d["panels"][2].update(id=d["panels"][1]["id"]), "panels: ids must be unique integers"),
    (lambda d: d["panels"][1]["gridPos"].update(x=20), "gridPos"),
    (lambda d: d["templating"]["list"].pop(), "variable 'fleet'"),
    (lambda d: d["panels"][1]["targets"].append(dict(d["panels"][1]["targets"][0])), "unique refIds"),
])
def test_required_field_check_catches_breakage(breakage, problem):
    dashboard = load_dashboard()
    breakage(dashboard)
    assert any(problem in p for p in required_field_problems(dashboard))


def test_every_query_parses_and_filters_by_namespace_and_fleet():
    dashboard = load_dashboard()
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 30
    for where, expr in queries:
        parse(expr)
        if where.startswith("panel") and "pdfleet_operator_reconciles_total" not in expr:
            assert 'namespace=~"$namespace"' in expr and 'fleet=~"$fleet"' in expr, where


def render(values):
    manifests = helm_python.Chart.load(str(CHART)).render(values, name="pdfleet", namespace="pdfleet-system")
    return [d for path, text in manifests.items() if not path.endswith("NOTES.txt")
            for d in yaml.safe_load_all(text) if d]


def test_chart_ships_the_dashboard_for_grafanas_sidecar_only_when_enabled():
    assert not [d for d in render({}) if d["kind"] == "ConfigMap" and "grafana" in d["metadata"]["name"]]
    (cm,) = [d for d in render({"grafanaDashboard": {"enabled": True, "namespace": "monitoring",
                                                     "annotations": {"grafana_folder": "pdfleet"}}})
             if d["kind"] == "ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "pdfleet"}
    assert json.loads(cm["data"]["pdfleet-fleet.json"]) == load_dashboard()
