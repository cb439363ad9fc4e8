"""Which metrics the dashboard and the alert rules query, and which a /metrics page exports.

Expressions are parsed with promql-parser (a real PromQL parser), never with regexes. Grafana
variables are substituted first: `$__rate_interval` and friends by a duration, `$namespace`
and other user variables only ever appear inside label matcher strings, which parse as is.
"""

from __future__ import annotations

import re
from typing import Any, Iterable, Iterator, Mapping

from pdfleet.operator.observability.metrics_text import families

# Grafana's built-in interval variables, given a duration so the expression parses.
GRAFANA_INTERVALS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
_LABEL_VALUES = re.compile(r"^\s*label_values\((?P<selector>.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", re.S)


def substitute_intervals(expr: str, intervals: Mapping[str, str] = GRAFANA_INTERVALS) -> str:
    for name in sorted(intervals, key=len, reverse=True):  # $__rate_interval before $__interval
        expr = expr.replace(name, intervals[name])
    return expr


def parse(expr: str, intervals: Mapping[str, str] = GRAFANA_INTERVALS) -> Any:
    """The promql-parser AST; ValueError names the expression when it does not parse."""
    import promql_parser

    text = substitute_intervals(expr, intervals)
    try:
        return promql_parser.parse(text)
    except Exception as exc:  # the parser raises its own error types
        raise ValueError(f"not valid PromQL: {text!r}: {exc}") from None


def children(node: Any) -> Iterator[Any]:
    """The sub-expressions of an AST node."""
    import promql_parser as p

    if isinstance(node, p.AggregateExpr):
        yield node.expr
        if node.param is not None:
            yield node.param
    elif isinstance(node, p.BinaryExpr):
        yield node.lhs
        yield node.rhs
    elif isinstance(node, p.Call):
        yield from node.args
    elif isinstance(node, p.MatrixSelector):
        yield node.vector_selector
    elif isinstance(node, (p.ParenExpr, p.SubqueryExpr, p.UnaryExpr)):
        yield node.expr


def selector_name(node: Any) -> str | None:
    """A vector selector's metric name (its bare name or a `__name__="..."` matcher)."""
    if node.name:
        return str(node.name)
    for m in node.matchers.matchers:
        if m.name == "__name__" and str(m.op).endswith("Equal") and "Not" not in str(m.op):
            return str(m.value)
    return None


def metric_names(expr: str) -> set[str]:
    """Every metric name the expression selects."""
    import promql_parser as p

    out: set[str] = set()
    stack = [parse(expr)]
    while stack:
        node = stack.pop()
        if isinstance(node, p.VectorSelector):
            name = selector_name(node)
            if name:
                out.add(name)
        stack.extend(children(node))
    return out


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every panel target and every query variable of a Grafana dashboard."""
    out: list[tuple[str, str]] = []

    def walk(panels: Iterable[Mapping[str, Any]]) -> None:
        for panel in panels:
            for target in panel.get("targets") or []:
                if target.get("expr"):
                    out.append((f"panel {panel.get('title')!r} {target.get('refId')}", target["expr"]))
            walk(panel.get("panels") or [])

    walk(dashboard.get("panels") or [])
    for var in (dashboard.get("templating") or {}).get("list") or []:
        if var.get("type") != "query":
            continue
        query = var.get("query")
        query = query.get("query") if isinstance(query, Mapping) else query
        match = _LABEL_VALUES.match(query or "")
        if match:  # label_values(selector, label): the selector is PromQL
            out.append((f"variable {var.get('name')!r}", match.group("selector")))
        elif query:
            out.append((f"variable {var.get('name')!r}", query))
    return out


def rule_queries(prometheus_rule: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(where, PromQL) for every rule of a PrometheusRule object."""
    out = []
    for group in (prometheus_rule.get("spec") or {}).get("groups") or []:
        for rule in group.get("rules") or []:
            name = rule.get("alert") or rule.get("record")
            out.append((f"rule {group.get('name')}/{name}", str(rule["expr"])))
    return out


_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gaugehistogram": ("_bucket", "_gcount", "_gsum"),
    "summary": ("", "_count", "_sum", "_created"),
    "info": ("_info",),
}


def exported_names(text: str) -> set[str]:
    """Every series name a /metrics page (Prometheus text format) exports, including those of
    families it declares with no sample yet (a labelled counter before its first increment)."""
    out: set[str] = set()
    for family in families(text):
        out.update(s.name for s in family.samples)
        out.update(family.name + suffix for suffix in _SUFFIXES.get(family.type, ("",)))
    return out


def missing_metrics(queries: Iterable[tuple[str, str]], exported: set[str]) -> dict[str, list[str]]:
    """{metric name: [where it is queried]} for the names no scraped page exports."""
    out: dict[str, list[str]] = {}
    for where, expr in queries:
        for name in sorted(metric_names(expr) - exported):
            out.setdefault(name, []).append(where)
    return out
