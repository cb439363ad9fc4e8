"""The waiting room's decisions (issue 41; pure: no clock, no I/O; table-tested).

While no prefill/decode pair is ready (endpoints.py: a revision is serviceable only with a ready
endpoint of each role, so a pair whose prefill is still waking is not ready, and no held request is
served decode-alone meanwhile), a front end with the waiting room on holds each generate request
instead of answering 503, up to ``max_waiting`` requests and ``max_bytes`` of their bodies (already
read, so memory is what is bounded). The edge (waiting.py) releases every held request once a pair
is ready, in flow control's order, and answers those that wait past ``timeout_s``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from pdfleet.connector.serving.endpoints import ROLES, RevisionEndpoints
from pdfleet.contract.scale_to_zero import REJECTED_NO_ENDPOINTS, REJECTED_TTL_EXPIRED, REJECTED_WAITING_ROOM_FULL

PASS = "pass"  # the pipeline goes on (a pair is ready, or the room is off: the old 503 at once)
HOLD = "hold"  # held until a pair is ready or timeout_s
FULL = "full"  # refused at once: the room holds max_waiting requests or max_bytes of bodies
# A held request expired while endpoints exist (a role is up, its partner still waking, or a pair came up
# just as it expired): the pair is seconds from serving, so the client is told to come back soon.
EXPIRED_RETRY_AFTER_S = 5


@dataclass(frozen=True)
class Bounds:
    max_waiting: int  # 0: the waiting room is off
    max_bytes: int
    timeout_s: float


@dataclass(frozen=True)
class Drop:
    """How a request the waiting room gives up on is answered (the reason goes in its header)."""

    status: int
    reason: str  # contract/scale_to_zero.py: DROPPED_REASONS
    retry_after_s: int | None = None


def arrival(bounds: Bounds, *, pair_ready: bool, held: int, held_bytes: int, size: int) -> str:
    """PASS, HOLD or FULL for a request of ``size`` body bytes, the room holding ``held`` requests of
    ``held_bytes`` bytes."""
    if bounds.max_waiting <= 0 or pair_ready:
        return PASS
    if held >= bounds.max_waiting or held_bytes + size > bounds.max_bytes:
        return FULL
    return HOLD


def room_full() -> Drop:
    return Drop(503, REJECTED_WAITING_ROOM_FULL)


def expired(*, endpoints_up: bool) -> Drop:
    """A held request waited ``timeout_s``: 503 when no endpoint of either role came up, else 429 with
    Retry-After (endpoints exist, but no ready pair took it in time)."""
    if endpoints_up:
        return Drop(429, REJECTED_TTL_EXPIRED, EXPIRED_RETRY_AFTER_S)
    return Drop(503, REJECTED_NO_ENDPOINTS)


def health(bounds: Bounds, *, pair_ready: bool) -> tuple[int, str]:
    """A front end's /health status and word (the Endpoint Picker's gRPC readiness follows it): ready while
    a pair is, and also while the room can hold requests: a fleet at zero must keep its front ends in their
    Service (or nothing reaches the room) and scraped (the operator wakes the pair from their gauge)."""
    if pair_ready:
        return 200, "ok"
    if bounds.max_waiting > 0:
        return 200, "waiting"
    return 503, "unavailable"


def endpoints_up(groups: Iterable[RevisionEndpoints]) -> bool:
    """Some revision has a ready endpoint of some role."""
    return any(g.ready(role) for g in groups for role in ROLES)
