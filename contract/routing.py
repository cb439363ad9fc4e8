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

# Response headers the router adds (clients and the smoke check read them).
FALLBACK_HEADER = "x-pdfleet-fallback"  # served without P/D, and why (e.g. decode-only)
FALLBACK_DECODE_ONLY = "decode-only"
REVISION_HEADER = "x-pdfleet-revision"  # the revision that served the request
