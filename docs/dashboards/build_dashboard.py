"""Writes the pdfleet Grafana dashboard (docs/dashboards/pdfleet.json and the chart's copy).

Run `python docs/dashboards/build_dashboard.py` after changing a panel here; the JSON is
what Grafana imports and the chart ships. tests/unit/observability checks both copies are
equal, valid, and name only metrics that pdfleet, vLLM and the operator export.

Series labels `namespace`, `fleet`, `pod`, `role` and `revision` are target labels: the
chart's PodMonitor (metrics.podMonitor) copies them from the fleet's pod labels, and the
operator's ServiceMonitor honours the operator's own `namespace` / `fleet` labels.
"""

from __future__ import annotations

import json
from pathlib import Path

from pdfleet.contract import scale_to_zero as stz

HERE = Path(__file__).resolve().parent
CHART_COPY = HERE.parents[1] / "charts" / "pdfleet" / "files" / "grafana-dashboard.json"
DOCS_COPY = HERE / "pdfleet.json"

SEL = 'namespace=~"$namespace", fleet=~"$fleet"'
RATE = "$__rate_interval"


def sel(extra: str = "") -> str:
    return "{" + SEL + (", " + extra if extra else "") + "}"


DECODE = sel('role="decode"')
DESIRED_READY = sel('state=~"desired|ready"')
TRUE = sel('status="true"')
KV_TIER_PANEL = "Cached prompt tokens by tier"


def quantiles(metric: str, extra: str, by: str) -> list[dict]:
    return [{"expr": f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{sel(extra)}[{RATE}])))",
             "legendFormat": f"p{int(q * 100)} {{{{{by}}}}}"} for q in (0.5, 0.9, 0.99)]


def panel(title: str, targets: list[dict], unit: str = "short", description: str = "", kind: str = "timeseries",
          w: int = 8) -> dict:
    return {"kind": kind, "title": title, "description": description, "w": w, "unit": unit, "targets": targets}


def t(expr: str, legend: str) -> dict:
    return {"expr": expr, "legendFormat": legend}


ROWS: list[tuple[str, list[dict]]] = [
    ("Serving", [
        panel("Requests by route and code", [
            t(f"sum by (route, code) (rate(pdfleet_router_requests_total{sel()}[{RATE}]))", "{{route}} {{code}}")],
            "reqps", "Requests the router answered."),
        panel("Errors and fallbacks", [
            t(f"sum by (kind) (rate(pdfleet_router_errors_total{sel()}[{RATE}]))", "error {{kind}}"),
            t(f"sum by (reason) (rate(pdfleet_router_fallbacks_total{sel()}[{RATE}]))", "fallback {{reason}}")],
            "reqps", "Router errors by kind; requests served by decode alone (no KV transfer) by reason."),
        panel("Fallback share", [
            t(f"sum(rate(pdfleet_router_fallbacks_total{sel()}[{RATE}])) / "
              f"sum(rate(pdfleet_router_requests_total{sel()}[{RATE}]))", "fallback share")],
            "percentunit", "Share of requests served without P/D."),
        panel("Disaggregation decisions", [
            t(f"sum by (decision, reason) (rate(pdfleet_router_disaggregation_decisions_total{sel()}[{RATE}]))",
              "{{decision}} {{reason}}")],
            "reqps", "The router's choice per request (spec.router.disaggregation): remote_prefill (prefill, then "
                     "decode pulls the KV) or decode_only (decode computes the prompt), by reason. Under Always every "
                     "request but n > 1 is remote_prefill."),
        panel("Time to first token (decode) by revision", quantiles("vllm:time_to_first_token_seconds",
                                                                    'role="decode"', "revision"),
              "s", "vLLM's TTFT on decode: from decode's arrival, the KV pull included (the prefill leg is before it; "
                   "see Router legs)."),
        panel("Inter-token latency (decode) by revision", quantiles("vllm:inter_token_latency_seconds",
                                                                    'role="decode"', "revision"), "s"),
        panel("Router legs p90", [
            t(f"histogram_quantile(0.9, sum by (le, leg) (rate(pdfleet_router_leg_latency_seconds_bucket{sel()}"
              f"[{RATE}])))", "{{leg}}")],
            "s", "prefill: whole prefill leg; decode_first_byte: until decode's response headers; decode: whole relay."),
    ]),
    ("KV transfer", [
        panel("KV pulled (GB/s) by decode pod", [
            t(f"sum by (pod) (rate(vllm:pdfleet_connector_pull_bytes_total{sel()}[{RATE}])) / 1e9", "{{pod}}")],
            "GBs", "Bytes decode pulled from prefill per second of wall time."),
        panel("Pull throughput while pulling (GB/s)", [
            t(f"sum(rate(vllm:pdfleet_connector_pull_bytes_total{sel()}[{RATE}])) / "
              f"sum(rate(vllm:pdfleet_connector_pull_seconds_total{sel()}[{RATE}])) / 1e9", "GB/s")],
            "GBs", "Bytes over the time from posting a pull's reads to their completion."),
        panel("Descriptors per pull", [
            t(f"sum(rate(vllm:pdfleet_connector_pull_descriptors_total{sel()}[{RATE}])) / "
              f"sum(rate(vllm:pdfleet_connector_pulls_total{sel()}[{RATE}]))", "descriptors")],
            "short", "NIXL descriptors posted per completed pull (fewer is better: coalesced block runs)."),
        panel("Prompt tokens by source (decode)", [
            t(f"sum by (source) (rate(vllm:prompt_tokens_by_source_total{DECODE}[{RATE}]))", "{{source}}")],
            "short", "external_kv_transfer: pulled from prefill; local_compute: computed by decode."),
        panel(KV_TIER_PANEL, [
            t(f"sum by (role, source) (rate(vllm:prompt_tokens_cached_by_source_total{sel()}[{RATE}]))",
              "{{role}} {{source}}")],
            "short", "Prompt tokens per second whose KV an engine did not compute, by where it came from: device "
            "(its own KV cache), host (the offload tier of spec.kvOffload, loaded from host memory), p2p (pulled by "
            "pdfleet's connector), disk. host stays 0 without the tier."),
        panel("KV failures by kind", [
            t(f"sum(rate(vllm:pdfleet_connector_pull_failures_total{sel()}[{RATE}]))", "pull failed"),
            t(f"sum(rate(vllm:pdfleet_connector_pull_lease_expired_total{sel()}[{RATE}]))", "pull: lease expired"),
            t(f"sum(rate(vllm:pdfleet_connector_handshake_failures_total{sel()}[{RATE}]))", "handshake failed"),
            t(f"sum(rate(vllm:pdfleet_connector_handshakes_rejected_total{sel()}[{RATE}]))", "handshake rejected"),
            t(f"sum(rate(vllm:pdfleet_connector_messages_rejected_total{sel()}[{RATE}]))", "message rejected"),
            t(f"sum(rate(vllm:pdfleet_connector_params_rejected_total{sel()}[{RATE}]))", "params rejected"),
            t(f"sum by (leg, reason) (rate(pdfleet_router_leg_failures_total{sel()}[{RATE}]))",
              "router {{leg}} {{reason}}")],
            "ops", "Connector counters (one per kind) and the router's failed legs by reason."),
        panel("Leases expired, handshakes, stale agents", [
            t(f"sum(rate(vllm:pdfleet_connector_leases_expired_total{sel()}[{RATE}]))", "leases expired (prefill)"),
            t(f"sum(rate(vllm:pdfleet_connector_handshakes_total{sel()}[{RATE}]))", "handshakes"),
            t(f"sum(rate(vllm:pdfleet_connector_stale_agents_dropped_total{sel()}[{RATE}]))", "stale agents dropped")],
            "ops", "Prefill leases freed by expiry (decode never confirmed), handshakes, NIXL peers dropped."),
    ]),
    ("Engines", [
        panel("Requests waiting (queue) by pod", [
            t(f"sum by (pod, role) (vllm:num_requests_waiting{sel()})", "{{role}} {{pod}}")], "short"),
        panel("Requests running by pod", [
            t(f"sum by (pod, role) (vllm:num_requests_running{sel()})", "{{role}} {{pod}}")], "short"),
        panel("KV cache usage by pod", [
            t(f"max by (pod, role) (vllm:kv_cache_usage_perc{sel()})", "{{role}} {{pod}}")], "percentunit",
            "vLLM's kv_cache_usage_perc (a fraction, 1 = full)."),
        panel("Router legs in flight by role", [
            t(f"sum by (role) (pdfleet_router_in_flight{sel()})", "{{role}}")], "short"),
    ]),
    ("Fleet", [
        panel("Replicas desired and ready by role", [
            t(f"sum by (role, state) (pdfleet_operator_fleet_replicas{DESIRED_READY})", "{{role}} {{state}}")], "short"),
        panel("Serving revision", [
            t(f"max by (fleet, revision) (pdfleet_operator_fleet_revision_info{sel()})", "{{fleet}} {{revision}}"),
            t(f"max by (revision) (pdfleet_router_serving_revision{sel()})", "router {{revision}}")],
            "short", "1 for the revision that serves (operator status and each router's view).", kind="table"),
        panel("Conditions", [
            t(f"max by (fleet, type) (pdfleet_operator_fleet_condition{TRUE})", "{{fleet}} {{type}}")],
            "short", "1 while the condition is True.", kind="state-timeline"),
        panel("Scale to zero: held requests, activations, retirements", [
            t(f"sum by (fleet) ({stz.ROUTER_WAITING_REQUESTS}{sel()})", "{{fleet}} held"),
            t(f"sum by (fleet) (increase(pdfleet_operator_pair_activations_total{sel()}[{RATE}]))",
              "{{fleet}} activations"),
            t(f"sum by (fleet) (increase(pdfleet_operator_pair_retirements_total{sel()}[{RATE}]))",
              "{{fleet}} retirements")],
            "short", "spec.scaling.scaleToZero: requests the front ends hold while no prefill/decode pair is ready, "
            "and the operator's writes of both scalers 0 -> 1 (activations) and -> 0 (retirements)."),
        panel("Reconciles by result", [
            t(f"sum by (result) (rate(pdfleet_operator_reconciles_total[{RATE}]))", "{{result}}")], "ops",
            "The operator's reconciles (all fleets it serves)."),
    ]),
]


def build() -> dict:
    panels: list[dict] = []
    pid, y = 1, 0
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "id": pid, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        pid, y, x = pid + 1, y + 1, 0
        for p in row:
            if x + p["w"] > 24:
                x, y = 0, y + 8
            targets = [{"datasource": {"type": "prometheus", "uid": "${datasource}"}, "refId": chr(65 + i),
                        "expr": tg["expr"], "legendFormat": tg["legendFormat"]} for i, tg in enumerate(p["targets"])]
            panels.append({
                "type": p["kind"], "title": p["title"], "description": p["description"], "id": pid,
                "datasource": {"type": "prometheus", "uid": "${datasource}"},
                "gridPos": {"h": 8, "w": p["w"], "x": x, "y": y},
                "fieldConfig": {"defaults": {"unit": p["unit"]}, "overrides": []},
                "options": {}, "targets": targets,
            })
            pid, x = pid + 1, x + p["w"]
        y += 8
    var = {"type": "query", "datasource": {"type": "prometheus", "uid": "${datasource}"}, "refresh": 2,
           "includeAll": True, "multi": True, "allValue": ".*", "current": {}, "sort": 1}
    return {
        "title": "pdfleet: P/D fleet",
        "uid": "pdfleet-fleet",
        "tags": ["pdfleet", "vllm"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "timezone": "browser",
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [
            {"type": "datasource", "name": "datasource", "label": "Data source", "query": "prometheus",
             "current": {}, "hide": 0},
            {**var, "name": "namespace", "label": "Namespace",
             "query": {"query": "label_values(pdfleet_operator_fleet_replicas, namespace)", "refId": "ns"}},
            {**var, "name": "fleet", "label": "Fleet",
             "query": {"query": 'label_values(pdfleet_operator_fleet_replicas{namespace=~"$namespace"}, fleet)',
                       "refId": "fleet"}},
        ]},
        "panels": panels,
    }


def main() -> None:
    text = json.dumps(build(), indent=2) + "\n"
    for path in (DOCS_COPY, CHART_COPY):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
