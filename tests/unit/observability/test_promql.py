"""Metric names come out of PromQL through a real parser; exported names out of real exposition text."""

from __future__ import annotations

import pytest

from pdfleet.operator.observability.promql import (
    dashboard_queries, exported_names, metric_names, missing_metrics, parse, rule_queries,
)


@pytest.mark.parametrize("expr, names", [
    ("up", {"up"}),
    ('sum by (le) (rate(vllm:ttft_seconds_bucket{namespace=~"$namespace"}[$__rate_interval]))',
     {"vllm:ttft_seconds_bucket"}),
    ("a_total / ignoring(x) group_left b + on() c", {"a_total", "b", "c"}),
    ('histogram_quantile(0.9, sum by (le) (rate({__name__="x_bucket"}[5m])))', {"x_bucket"}),
    ("max_over_time(rate(a_total[1m])[10m:1m]) > bool 3", {"a_total"}),
    ("-(x) * 2", {"x"}),
    ("topk(3, y)", {"y"}),
    ('count_values("v", z)', {"z"}),
    ("1 + 2", set()),
    ('label_replace(q, "a", "$1", "b", "(.*)")', {"q"}),
    # A name in a string or a label value is not a selected metric (a regex would say otherwise).
    ('label_replace(q, "dst", "not_a_metric_total", "", "")', {"q"}),
    ('r{le="pdfleet_fake_total"}', {"r"}),
])
def test_metric_names(expr, names):
    assert metric_names(expr) == names


@pytest.mark.parametrize("expr", ["sum(rate(x[5m])", "rate(x)", "x{a=}", "sum by le (x)"])
def test_invalid_promql_is_an_error_naming_the_expression(expr):
    with pytest.raises(ValueError, match="not valid PromQL"):
        parse(expr)


EXPOSITION = """\
# HELP c_total A counter with labels and no sample yet.
# TYPE c_total counter
# HELP vllm:h_seconds A histogram.
# TYPE vllm:h_seconds histogram
vllm:h_seconds_bucket{engine="0",le="1.0"} 1.0
vllm:h_seconds_bucket{engine="0",le="+Inf"} 1.0
vllm:h_seconds_count{engine="0"} 1.0
vllm:h_seconds_sum{engine="0"} 0.5
# HELP g A gauge.
# TYPE g gauge
g{role="decode"} 3.0
"""


def test_exported_names_include_declared_families_without_samples():
    names = exported_names(EXPOSITION)
    assert {"c_total", "vllm:h_seconds_bucket", "vllm:h_seconds_count", "vllm:h_seconds_sum", "g"} <= names
    assert "h_seconds_bucket" not in names and "g_total" not in names


def test_missing_metrics_names_the_query():
    queries = [("panel A", "rate(c_total[5m]) / g"), ("panel B", "rate(c_totl[5m])")]
    assert missing_metrics(queries, exported_names(EXPOSITION)) == {"c_totl": ["panel B"]}


def test_queries_of_a_dashboard_and_a_rule():
    dashboard = {
        "panels": [{"type": "row", "title": "r", "panels": [{"title": "in row", "targets": [{"refId": "A", "expr": "a"}]}]},
                   {"title": "p", "targets": [{"refId": "A", "expr": "b"}, {"refId": "B", "expr": ""}]}],
        "templating": {"list": [
            {"type": "query", "name": "ns", "query": {"query": 'label_values(c{x="1"}, namespace)'}},
            {"type": "datasource", "name": "ds", "query": "prometheus"},
        ]},
    }
    assert dashboard_queries(dashboard) == [("panel 'in row' A", "a"), ("panel 'p' A", "b"), ("variable 'ns'", 'c{x="1"}')]
    rule = {"spec": {"groups": [{"name": "g", "rules": [{"alert": "X", "expr": "d > 1"}, {"record": "y:z", "expr": 1}]}]}}
    assert rule_queries(rule) == [("rule g/X", "d > 1"), ("rule g/y:z", "1")]
