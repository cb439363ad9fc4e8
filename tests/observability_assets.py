"""The dashboard and the alert rules as shipped (the chart's copy, the chart's rendered
PrometheusRule), and the PromQL queries in them, for the tests that check them against
real /metrics pages (tests/e2e/local, tests/integration/operator, tests/unit/observability)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "charts" / "pdfleet"
DASHBOARD = CHART / "files" / "grafana-dashboard.json"
DOCS_DASHBOARD = REPO / "docs" / "dashboards" / "pdfleet.json"
OPERATOR_PREFIX = "pdfleet_operator_"   # series only the operator exports; the rest come from engines and routers


def load_dashboard() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


@lru_cache(maxsize=None)
def _rendered_rules() -> str:
    import helm_python

    values = {"metrics": {"prometheusRule": {"enabled": True}}}
    manifests = helm_python.Chart.load(str(CHART)).render(values, name="pdfleet", namespace="pdfleet-system")
    return next(text for path, text in manifests.items() if path.endswith("prometheusrule.yaml"))


def prometheus_rule() -> dict[str, Any]:
    (doc,) = [d for d in yaml.safe_load_all(_rendered_rules()) if d]
    return doc


def all_queries() -> list[tuple[str, str]]:
    """(where, PromQL) of every dashboard panel and variable and every alert rule."""
    from pdfleet.operator.observability.promql import dashboard_queries, rule_queries

    return dashboard_queries(load_dashboard()) + rule_queries(prometheus_rule())


def split_by_source(missing: dict[str, list[str]]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """(names the operator exports, names engines and routers export) of a missing-metrics map."""
    operator = {k: v for k, v in missing.items() if k.startswith(OPERATOR_PREFIX)}
    fleet = {k: v for k, v in missing.items() if not k.startswith(OPERATOR_PREFIX)}
    return operator, fleet
