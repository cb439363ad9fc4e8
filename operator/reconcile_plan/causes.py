"""Why a fleet's pods are not ready, per role, and the Warning events about it (pure; issue 39).

Only the fleet's own pods count (``Gate.pods``: run by its workloads through the controller chain,
kube/owned.py), never a pod for its labels. A pod that is ready or being deleted has no cause. Causes
are grouped per role and (reason, subject) with the number of pods that have them; the Ready
condition's message lists them and each new one is posted once as a Warning event.

One event per cause, not per reconcile: a cause is reported when it is not among those already
reported since the fleet was last complete (a crash-looping container comes and goes between its
restarts; it is one cause). The set is kept by the reconciler and bounded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

from pdfleet.contract.labels import ROLE_EPP
from pdfleet.operator.kube.observed import ObservedPod
from pdfleet.operator.kube.pod_causes import PodCause

ROLES = ("prefill", "decode", "router", ROLE_EPP)
ROLE_NAMES = {ROLE_EPP: "endpoint picker"}   # as the Ready message names roles
MAX_SHOWN = 4      # causes listed in a condition's message; the rest are counted
MAX_REMEMBERED = 64  # causes remembered as reported (beyond: start over from the current ones)

CauseKey = tuple[str, str, str]  # (role, reason, subject)


@dataclass(frozen=True)
class RoleCause:
    role: str
    cause: PodCause
    pods: int          # how many of the role's pods have it
    pod: str           # one of them (the first by name)

    @property
    def key(self) -> CauseKey:
        return self.role, self.cause.reason, self.cause.subject

    def text(self) -> str:
        n = f"{self.pods} pod{'s' if self.pods != 1 else ''}"
        return f"{ROLE_NAMES.get(self.role, self.role)} {self.cause.reason} ({n}): {self.cause.text()}"


def role_causes(pods: Iterable[ObservedPod]) -> tuple[RoleCause, ...]:
    """The causes of the given (owned) pods that are neither ready nor being deleted, in role order,
    then the most common first; the detail and the pod named are the first pod's by name."""
    groups: dict[CauseKey, list[ObservedPod]] = {}
    for p in sorted(pods, key=lambda p: p.name):
        if p.cause is None or p.ready or p.deleting or p.role not in ROLES:
            continue
        groups.setdefault((p.role, p.cause.reason, p.cause.subject), []).append(p)
    out = [RoleCause(role, members[0].cause, len(members), members[0].name)
           for (role, _, _), members in groups.items() if members[0].cause is not None]
    return tuple(sorted(out, key=lambda c: (ROLES.index(c.role), -c.pods, c.cause.reason, c.cause.subject)))


def causes_message(causes: Sequence[RoleCause]) -> str:
    """``prefill Unschedulable (2 pods): 0/3 nodes are available: 3 Insufficient rdma/ib; ...``"""
    shown = [c.text() for c in causes[:MAX_SHOWN]]
    more = f"; and {len(causes) - MAX_SHOWN} more" if len(causes) > MAX_SHOWN else ""
    return "; ".join(shown) + more


def first_reason(causes: Sequence[RoleCause], roles: Iterable[str]) -> Optional[str]:
    """The reason of the first cause of one of ``roles`` (those without a ready pod), or None."""
    wanted = set(roles)
    return next((c.cause.reason for c in causes if c.role in wanted), None)


def new_causes(causes: Sequence[RoleCause], reported: frozenset[CauseKey]) -> list[RoleCause]:
    """The causes not reported yet (each gets one Warning event)."""
    return [c for c in causes if c.key not in reported]


def remembered(causes: Sequence[RoleCause], reported: frozenset[CauseKey], *, complete: bool) -> frozenset[CauseKey]:
    """The reported causes after this reconcile: forgotten once the fleet is complete, bounded by count."""
    now = frozenset(c.key for c in causes)
    if complete:
        return now
    kept = reported | now
    return kept if len(kept) <= MAX_REMEMBERED else now


def event_message(c: RoleCause) -> str:
    return f"{ROLE_NAMES.get(c.role, c.role)} pod {c.pod}" + (
        f" and {c.pods - 1} more" if c.pods > 1 else "") + f": {c.cause.text()}"
