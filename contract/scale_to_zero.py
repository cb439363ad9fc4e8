"""Scale to zero as a P/D pair (issue 41): the names the front ends (the waiting room in
connector/serving/) and the operator (operator/autoscale/scale_to_zero.py) share.

The front ends (the router and the gateway's Endpoint Picker, through the one serving pipeline) hold requests while no prefill/decode pair is ready, in a
*waiting room* bounded by ``spec.scaling.scaleToZero.maxWaiting`` (by count) and by the bytes of the
bodies held, and expose how many wait. The operator reads that gauge (and the activations counter,
which a scrape cannot miss) from the front ends' /metrics and writes 0 -> 1 on both roles' scalers;
the front ends write nothing to the cluster.

Held requests past ``activationTimeoutSeconds`` are answered with ``DROPPED_REASON_HEADER``:
503 ``REJECTED_NO_ENDPOINTS`` when no endpoint came up, 429 ``REJECTED_TTL_EXPIRED`` (with
Retry-After) when endpoints exist but no ready pair took the request; an arrival the full room
cannot hold gets 503 ``REJECTED_WAITING_ROOM_FULL`` at once.
"""

from __future__ import annotations

# The router's and the Endpoint Picker's settings: RouterConfig.scale_to_zero_max_waiting (0: the waiting
# room off, 503 at once while no pair is ready), .scale_to_zero_activation_timeout_s and
# .scale_to_zero_max_waiting_bytes, flags --scale-to-zero-max-waiting, --scale-to-zero-activation-timeout-s,
# --scale-to-zero-max-waiting-bytes (contract/router_config.py renders and parses them)
DEFAULT_ACTIVATION_TIMEOUT_S = 60.0  # llm-d's noEndpointRequestTTL
DEFAULT_MAX_WAITING_BYTES = 256 * 1024 * 1024  # the bodies held at once (each at most --max-body-bytes)

# gauge: requests held in the waiting room now (the operator activates the pair while it is above 0)
ROUTER_WAITING_REQUESTS = "pdfleet_router_waiting_requests"
# counter: cold episodes, each counted once at its first held request (the activation asked for);
# exposed with the suffix _total: an increase between two scrapes is an activation even if the gauge
# was back at 0 when scraped
ROUTER_ACTIVATIONS = "pdfleet_router_activations"
# histogram: from an episode's first held request to the first ready pair
ROUTER_ACTIVATION_WAIT = "pdfleet_router_activation_wait_seconds"
# counter, label DROPPED_REASON (one of DROPPED_REASONS): held (or refused) requests answered without a pair;
# exposed with the suffix _total
ROUTER_WAITING_DROPPED = "pdfleet_router_waiting_dropped"
DROPPED_REASON = "reason"

# The answer's header, and its values (llm-d's spelling, under pdfleet's prefix)
DROPPED_REASON_HEADER = "x-pdfleet-request-dropped-reason"
REJECTED_NO_ENDPOINTS = "rejected-no-endpoints"  # 503: no ready endpoint of either role came up in time
REJECTED_TTL_EXPIRED = "rejected-ttl-expired"  # 429 + Retry-After: endpoints exist, no ready pair took it in time
REJECTED_WAITING_ROOM_FULL = "rejected-waiting-room-full"  # 503: maxWaiting (or the bytes bound) reached on arrival
DROPPED_REASONS = (REJECTED_NO_ENDPOINTS, REJECTED_TTL_EXPIRED, REJECTED_WAITING_ROOM_FULL)
