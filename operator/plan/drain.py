"""How long an engine drains on SIGTERM, and the pod's grace period around it (pure).

vLLM 0.32's API server handles SIGTERM itself: it stops its engine core with
``--shutdown-timeout`` seconds to spare. 0 (vLLM's default) aborts every in-flight
request at once; N > 0 makes the engine core reject new requests and keep stepping
until it has no work left or N seconds passed. "Work" includes finished requests whose
blocks a connector still holds (``request_finished`` asked to delay the free), which is
exactly a prefill's leases. So:

- prefill drains for one lease (plus a margin): every block a decode may still read is
  either read (the completion releases it) or its lease expires before the engine exits;
- decode drains long enough to finish its in-flight streams.

The pod's terminationGracePeriodSeconds leaves TEARDOWN_SECONDS after the drain for
vLLM's own teardown, so the kubelet's SIGKILL never cuts a drain short.
"""

from __future__ import annotations

from pdfleet.operator.api.types import DisaggregatedInferenceSpec

TEARDOWN_SECONDS = 15
LEASE_MARGIN_SECONDS = 15
MAX_GRACE_SECONDS = 600
DECODE_GRACE_SECONDS = 60


def termination_grace(spec: DisaggregatedInferenceSpec, role: str) -> int:
    if role == "prefill":
        return min(spec.kv_transfer.lease_seconds + LEASE_MARGIN_SECONDS + TEARDOWN_SECONDS, MAX_GRACE_SECONDS)
    return DECODE_GRACE_SECONDS


def shutdown_timeout(spec: DisaggregatedInferenceSpec, role: str) -> int:
    """vLLM's --shutdown-timeout for this role (always > 0: drain, never abort)."""
    return max(1, termination_grace(spec, role) - TEARDOWN_SECONDS)
