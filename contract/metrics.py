"""Router and Endpoint Picker metric names that the SLO planner (operator/autoscale/signals.py), the
dashboards and the benchmarks read."""

from __future__ import annotations

ROUTER_TTFT = "pdfleet_router_ttft_seconds"  # histogram: time to first token
ROUTER_ITL = "pdfleet_router_itl_seconds"  # histogram: inter-token latency
ROUTER_LEGS_WAITING = "pdfleet_router_legs_waiting"  # gauge, label LEG: legs waiting for an engine
ROUTER_STREAMS = "pdfleet_router_streams"  # gauge: decode streams being relayed
LEG = "leg"  # label of ROUTER_LEGS_WAITING: prefill | decode
# counter, labels reason and outcome: releases of prefill leases that no decode will read, sent by the
# router to the prefill that holds them (connector/serving/lease_release.py)
ROUTER_KV_RELEASES = "pdfleet_router_kv_releases"
# counter, label REVISION_OUTCOME: offers of decodes' holds for a conversation's next turn that the router kept
# alive, per offer (connector/serving/keep_alive.py)
ROUTER_KV_KEEP_ALIVES = "pdfleet_router_kv_keep_alives"
# counter, labels revision and REVISION_OUTCOME: generate requests per revision pair, read by the canary analysis
ROUTER_REVISION_REQUESTS = "pdfleet_router_revision_requests"
REVISION_OUTCOME = "outcome"  # also the outcome label of ROUTER_KV_RELEASES
OUTCOME_ANSWERED = "answered"  # answered below 500 (a client's 4xx is not the pair's fault)
OUTCOME_5XX = "5xx"  # answered 5xx by the router for this pair
# answered below 500 by decode alone because the pair's KV path failed (its prefill leg failed, or the lease
# expired before a decode retry), not by the disaggregation policy's choice: the canary's recompute rate
# counts it (operator/rollout/signals.py reads it; serving/timing.py counts it)
OUTCOME_FALLBACK = "kv_fallback"
# counter, labels decision (routing.REMOTE_PREFILL | DECODE_ONLY) and reason: the router's per-request choice
# (connector/serving/disaggregation.py); exposed with the suffix _total
ROUTER_DISAGGREGATION_DECISIONS = "pdfleet_router_disaggregation_decisions"
# counter, labels "role" and "endpoint" (the endpoint's name, never its URL): legs started on each endpoint, one
# per pick that took a leg (retries included); exposed with the suffix _total. Where each request went, for tests
# and dashboards that check a routing decision against the engines' own counters (issue 40)
ROUTER_LEGS_STARTED = "pdfleet_router_legs_started"
# gauge, label TOKENIZER_REASON: 1 once the router (and the Endpoint Picker, which exposes the router's metrics) hashes
# prompts with the served model's tokenizer as the engines do; 0 while it loads or once it could not, and prefix
# routing falls back to text chunks; one series at a time, its reason one of TOKENIZER_REASONS
# (connector/serving/kvaware/tokenizer.py sets it; `pdfleet local` prints it)
ROUTER_TOKENIZER_LOADED = "pdfleet_router_tokenizer_loaded"
TOKENIZER_REASON = "reason"
TOKENIZER_LOADED = "Loaded"
TOKENIZER_LOADING = "Loading"
TOKENIZER_GATED = "Gated"  # the Hub refused: a gated or private model without a token that may read it
TOKENIZER_NOT_FOUND = "NotFound"  # no such model id, or a path without tokenizer files (a PVC not mounted?)
TOKENIZER_UNREACHABLE = "Unreachable"  # the Hub cannot be reached and the files are in no cache (air-gapped?)
TOKENIZER_CACHE_NOT_WRITABLE = "CacheNotWritable"  # HF_HOME is not writable (read-only root without a cache volume)
TOKENIZER_NO_TRANSFORMERS = "NoTransformers"  # the image lacks transformers
TOKENIZER_FAILED = "Failed"  # anything else (the router's log has the error)
TOKENIZER_NOT_CONFIGURED = "NotConfigured"  # no --tokenizer
TOKENIZER_REASONS = (TOKENIZER_LOADED, TOKENIZER_LOADING, TOKENIZER_NOT_CONFIGURED, TOKENIZER_GATED, TOKENIZER_NOT_FOUND,
                     TOKENIZER_UNREACHABLE, TOKENIZER_CACHE_NOT_WRITABLE, TOKENIZER_NO_TRANSFORMERS, TOKENIZER_FAILED)
# histogram: the Endpoint Picker's time to choose a request's pair and endpoints (connector/epp/server.py;
# bench/gateway.py reads it)
EPP_DECISION = "pdfleet_epp_decision_seconds"
# counter, label reason (caller_auth.MISSING | MISMATCH | REPEATED): gRPC calls the Endpoint Picker refused
# with UNAUTHENTICATED (connector/epp/caller_auth.py); exposed with the suffix _total
EPP_UNAUTHENTICATED = "pdfleet_epp_unauthenticated"
# counter, label reason: ext_proc messages the EPP dropped as invalid at that point of a stream
EPP_DROPPED_MESSAGES = "pdfleet_epp_dropped_messages"
