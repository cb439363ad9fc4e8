"""How long an engine drains on SIGTERM, and the pod's grace period around it (pure).

vLLM 0.32's API server handles SIGTERM itself: it stops its engine core with
``--shutdown-timeout`` seconds to spare. 0 (vLLM's default) aborts every in-flight
request at once; N > 0 makes the engine core reject new requests and keep stepping
until it has no work left or N seconds passed. "Work" includes finished requests whose
blocks a connector still holds (``request_finished`` asked to delay the free), which is
exactly a prefill's leases. So:

- prefill drains for one lease (plus a margin): every block a decode may still read is
  either read (the completion releases it) or its lease expires before the engine exits;
- decode drains as long as the router waits for a decode leg's first byte
  (non-streaming: the whole generation), so that no leg the router still waits for is
  cut; it exits as soon as it is idle;
- the router drains its requests in flight (aiohttp's shutdown timeout: the longest a
  request may take, RouterConfig.max_request_seconds);
- after a rollout switches the router, the old pair stays until every request admitted
  before the switch has finished its prefill leg and started its decode leg (then the old
  decodes drain on SIGTERM as above).

The pod's terminationGracePeriodSeconds leaves TEARDOWN_SECONDS after the drain for
vLLM's own teardown, so the kubelet's SIGKILL never cuts a drain short.
"""

from __future__ import annotations

import math

from pdfleet.contract.router_config import RouterConfig
from pdfleet.operator.api.types import DisaggregatedInferenceSpec

TEARDOWN_SECONDS = 15
LEASE_MARGIN_SECONDS = 15
MAX_GRACE_SECONDS = 600
# The router as the plan runs it (its timeouts are RouterConfig's defaults).
ROUTER = RouterConfig(kubernetes_fleet="-")
DECODE_GRACE_SECONDS = math.ceil(ROUTER.decode_first_byte_timeout_s) + TEARDOWN_SECONDS
ROUTER_GRACE_SECONDS = math.ceil(ROUTER.max_request_seconds()) + TEARDOWN_SECONDS


def rollout_drain_seconds(router: RouterConfig = ROUTER) -> int:
    """How long the old pair stays after the router switched: every request admitted before the
    switch has by then finished its prefill leg and reached its decode (which then drains)."""
    return math.ceil(2 * router.connect_timeout_s + router.prefill_timeout_s) + LEASE_MARGIN_SECONDS


def termination_grace(spec: DisaggregatedInferenceSpec, role: str) -> int:
    if role == "prefill":
        return min(spec.kv_transfer.lease_seconds + LEASE_MARGIN_SECONDS + TEARDOWN_SECONDS, MAX_GRACE_SECONDS)
    if role == "router":
        return ROUTER_GRACE_SECONDS
    return DECODE_GRACE_SECONDS


def shutdown_timeout(spec: DisaggregatedInferenceSpec, role: str) -> int:
    """vLLM's --shutdown-timeout for this role (always > 0: drain, never abort)."""
    return max(1, termination_grace(spec, role) - TEARDOWN_SECONDS)
