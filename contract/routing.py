"""Routing policy names, the block hash the router reproduces, and the router's response headers."""

from __future__ import annotations

# How the router picks an endpoint of a role (spec.router.prefillPolicy / decodePolicy).
PREFIX_AWARE = "prefixAware"  # longest cached prompt prefix (from the engines' KV events), bounded by load
LEAST_OUTSTANDING = "leastOutstanding"  # fewest requests in flight
POLICIES = (PREFIX_AWARE, LEAST_OUTSTANDING)

# The engines' --prefix-caching-hash-algo: the one the router can reproduce without pickling.
PREFIX_HASH_ALGO = "sha256_cbor"
# vLLM's seed of the first block's parent hash unless PYTHONHASHSEED is set.
DEFAULT_HASH_SEED = "vllm-none-hash"

# The longest id kv_transfer_params may carry (request ids, engine ids, hosts): decode refuses
# longer ones, so the router keeps the request ids it makes under it (serving/request_id.py).
MAX_ID_LEN = 256

# The routes a fleet's front ends (the router, the gateway's Endpoint Picker) serve, and nothing else
# (404): generate routes run the P/D pipeline (path -> whether the body is a chat request); a
# passthrough route goes to a ready decode unchanged (path -> its method). The shipped HTTPRoutes
# send exactly these paths.
GENERATE_ROUTES = {"/v1/completions": False, "/v1/chat/completions": True}
PASSTHROUGH_ROUTES = {"/v1/models": "GET"}
SERVED_ROUTES = (*GENERATE_ROUTES, *PASSTHROUGH_ROUTES)

# Response headers the router adds (clients and the smoke check read them).
FALLBACK_HEADER = "x-pdfleet-fallback"  # served without P/D, and why (e.g. decode-only)
FALLBACK_DECODE_ONLY = "decode-only"
REVISION_HEADER = "x-pdfleet-revision"  # the revision that served the request
# Request header: the client's conversation id. The canary keeps every request carrying one id on
# one revision pair (serving/canary.py: ``conversation_key``); the first explicit key it looks for.
SESSION_HEADER = "x-session-id"

# Whether a request's prompt is prefilled remotely (spec.router.disaggregation.policy).
DISAGGREGATION_ALWAYS = "Always"  # every request prefill -> decode (decode alone only when P/D cannot serve it)
DISAGGREGATION_CONDITIONAL = "Conditional"  # per request: remote prefill only when it pays (serving/disaggregation.py)
DISAGGREGATION_POLICIES = (DISAGGREGATION_ALWAYS, DISAGGREGATION_CONDITIONAL)
# The decision per request: the decisions metric's label `decision` and the header below.
REMOTE_PREFILL = "remote_prefill"
DECODE_ONLY = "decode_only"
# Response header: the decision and its reason, e.g. "decode_only; reason=short_prompt". Unlike
# FALLBACK_HEADER, a chosen decode-only is no failure of P/D.
DISAGGREGATION_HEADER = "x-pdfleet-disaggregation"
