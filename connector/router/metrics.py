"""Prometheus metrics of one router (own registry, so several routers can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Legs are short on a warm fleet and long under load: 1 ms .. 2 min.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)


class RouterMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "pdfleet_router_requests", "Requests answered, by route and HTTP status", ["route", "code"], registry=r
        )
        self.errors = Counter(
            "pdfleet_router_errors", "Errors, by kind (client_* for the client's, the rest for the fleet's)",
            ["kind"], registry=r,
        )
        self.fallbacks = Counter(
            "pdfleet_router_fallbacks", "Requests served by decode alone, by reason", ["reason"], registry=r
        )
        self.retries = Counter(
            "pdfleet_router_retries", "Legs sent again to another endpoint", ["leg"], registry=r
        )
        self.leg_failures = Counter(
            "pdfleet_router_leg_failures", "Failed legs, by leg and reason", ["leg", "reason"], registry=r
        )
        self.client_kv_params_dropped = Counter(
            "pdfleet_router_client_kv_transfer_params_dropped", "Client requests that carried kv_transfer_params",
            registry=r,
        )
        self.client_disconnects = Counter(
            "pdfleet_router_client_disconnects", "Requests whose client went away before the end", registry=r
        )
        self.leg_latency = Histogram(
            "pdfleet_router_leg_latency_seconds",
            "Latency per leg: prefill (whole leg), decode_first_byte (until response headers), decode (whole relay)",
            ["leg"], buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.request_latency = Histogram(
            "pdfleet_router_request_latency_seconds", "Whole request as the router sees it", ["route"],
            buckets=_LATENCY_BUCKETS, registry=r,
        )
        self.in_flight = Gauge(
            "pdfleet_router_in_flight", "Legs in flight per endpoint", ["role", "endpoint"], registry=r
        )
        self.endpoints = Gauge(
            "pdfleet_router_endpoints", "Endpoints of the serving revision, by role and readiness",
            ["role", "ready"], registry=r,
        )
        self.revision = Gauge(
            "pdfleet_router_serving_revision", "1 for the revision that serves new requests", ["revision"],
            registry=r,
        )
