"""Observability assets' logic: the metric names a dashboard or alert rule queries (PromQL parsed
with promql-parser), the names a /metrics page exports, and a small PromQL evaluator over
recorded scrapes (the dashboard render in docs/dashboards/)."""
