"""Prometheus metrics of one router (own registry, so several routers can live in one process)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pdfleet.contract import metrics as names
from pdfleet.contract.kv_tiers import MEDIUM_LABEL, MEDIUM_UNKNOWN
from pdfleet.contract.routing import PREFIX_AWARE

# Legs are short on a warm fleet and long under load: 1 ms .. 2 min.
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
# What the SLO planner steers to (p90 from these buckets): TTFT in 10s of ms, ITL in ms.
_TTFT_BUCKETS = (0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 1, 1.25, 1.5, 2, 3, 5, 10, 30, 60)
_ITL_BUCKETS = (0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.06, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2)


class RouterMetrics:
    def tokenizer_state(self, reason: str) -> None:
        """The tokenizer's state as one series: loaded (1) or why not (0)."""
        self.tokenizer_loaded.clear()
        self.tokenizer_loaded.labels(reason).set(1 if reason == names.TOKENIZER_LOADED else 0)

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
        self.disaggregation_decisions = Counter(
            names.ROUTER_DISAGGREGATION_DECISIONS, "Generate requests by the router's choice (remote_prefill: prefill "
            "then decode; decode_only: decode alone) and its reason (connector/serving/disaggregation.py)",
            ["decision", "reason"], registry=r,
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
        self.legs_started = Counter(
            names.ROUTER_LEGS_STARTED, "Legs started per endpoint (the pick that took each leg)", ["role", "endpoint"],
            registry=r,
        )
        self.endpoints = Gauge(
            "pdfleet_router_endpoints", "Endpoints of the serving revision, by role and readiness",
            ["role", "ready"], registry=r,
        )
        self.endpointslices_refused = Counter(
            "pdfleet_router_endpointslices_refused", "EndpointSlices with the fleet's labels that the fleet does not "
            "own (not the EndpointSlice controller's slice of one of the fleet's Services), each counted once",
            registry=r,
        )
        self.revision = Gauge(
            "pdfleet_router_serving_revision", "1 for the revision that serves new requests", ["revision"],
            registry=r,
        )
        # SLO signals per revision (connector/serving/timing.py), read by the operator's planner.
        self.ttft = Histogram(
            names.ROUTER_TTFT, "Time to first token: request to decode's first answer byte relayed",
            ["revision"], buckets=_TTFT_BUCKETS, registry=r,
        )
        self.itl = Histogram(
            names.ROUTER_ITL, "Inter-token latency on streamed answers (chunk gap per event)",
            ["revision"], buckets=_ITL_BUCKETS, registry=r,
        )
        self.revision_requests = Counter(
            names.ROUTER_REVISION_REQUESTS, "Generate requests per revision pair, by outcome (5xx: the router answered "
            "5xx; answered: anything else), read by the canary analysis", ["revision", names.REVISION_OUTCOME],
            registry=r,
        )
        self.legs_waiting = Gauge(
            names.ROUTER_LEGS_WAITING, "Legs sent and not answered yet (decode: before its first byte)",
            [names.LEG, "revision"], registry=r,
        )
        self.streams = Gauge(
            names.ROUTER_STREAMS, "Decode legs answering (first byte seen, not finished)", ["revision"],
            registry=r,
        )
        self.kv_releases = Counter(
            names.ROUTER_KV_RELEASES, "Prefill leases that no decode will read, released at the prefill that holds "
            "them, by reason (decode_failed, decode_refused, lease_expired, client_gone) and outcome (accepted, "
            "refused, unsupported, failed, skipped)", ["reason", names.REVISION_OUTCOME], registry=r,
        )
        self.kv_keep_alives = Counter(
            names.ROUTER_KV_KEEP_ALIVES, "Decode holds for a conversation's next turn that the router kept alive, per "
            "offer, by outcome (kept, refused, lapsed, unsupported, failed, skipped)", [names.REVISION_OUTCOME],
            registry=r,
        )
        # KV-cache-aware routing (prefix_routing.py)
        self.tokenizer_loaded = Gauge(
            names.ROUTER_TOKENIZER_LOADED, "1: prompts are hashed with the served model's tokenizer, as the engines "
            "hash them; 0: not (loading, or it could not load: prefix routing falls back to text chunks), the reason "
            "says which", [names.TOKENIZER_REASON], registry=r,
        )
        self.prefix_decisions = Counter(
            "pdfleet_router_prefix_decisions", f"{PREFIX_AWARE} choices, by leg and what scored them "
            "(events: the engines' KV events; routed: what the router sent where; mixed: events for the endpoints "
            "whose stream is synced, routed for the others; none: least outstanding)",
            ["leg", "source"], registry=r,
        )
        self.prefix_cached_tokens = Counter(
            "pdfleet_router_prefix_cached_tokens", "Cached prompt-prefix tokens on the chosen endpoint (chosen) "
            "and on the best candidate (available), by the best KV tier holding each block (medium: GPU, CPU, "
            f"STORAGE; {MEDIUM_UNKNOWN} for source routed, an estimate at 4 characters a token)",
            ["leg", "kind", "source", MEDIUM_LABEL], registry=r,
        )
        self.kv_events_received = Counter(
            "pdfleet_router_kv_events_received", "KV event batches applied, per endpoint", ["endpoint"], registry=r
        )
        self.kv_events_dropped = Counter(
            "pdfleet_router_kv_events_dropped", "KV event messages dropped, per endpoint and reason",
            ["endpoint", "reason"], registry=r,
        )
        self.kv_index_resets = Counter(
            "pdfleet_router_kv_index_resets", "Block indexes cleared (gap, restart, joined_late, subscriber_restart)",
            ["endpoint", "reason"], registry=r,
        )
        self.kv_index_evicted = Counter(
            "pdfleet_router_kv_index_evicted_blocks", "Blocks a tier of an endpoint's index evicted at its bound "
            "(least recently stored first)", ["endpoint", MEDIUM_LABEL], registry=r,
        )
        self.kv_index_blocks = Gauge(
            "pdfleet_router_kv_index_blocks", "Block hashes the router knows an endpoint holds (all its tiers)", ["endpoint"],
            registry=r,
        )
