"""The KVTransport condition, from the fabric preflight's verdicts in pod statuses (pure).

Each engine pod's `kv-preflight` init container writes its verdict (JSON, see
pdfleet.contract.fabric) as its termination message; the kubelet copies it into
`status.initContainerStatuses[].state.terminated.message`, which the operator sees
through its pod watch. Per role, at the serving revision: False if any pod's verdict is
False (the first such pod named), True when every pod that reported is True, Unknown
while none has reported. The fleet's condition is the worst of its roles.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from pdfleet.contract.fabric import CONDITION_TYPE, VERIFIED
# A pod's own verdict is parsed where its status is observed; the roll-up to a condition is here.
from pdfleet.operator.kube.observed import PodTransport, from_pod_status

PENDING = "Pending"
__all__ = ["CONDITION_TYPE", "PodTransport", "RoleTransport", "fleet_transport", "from_pod_status", "role_transport"]


@dataclass(frozen=True)
class RoleTransport:
    status: str      # "True" | "False" | "Unknown"
    reason: str
    message: str
    transport: Optional[str] = None
    gbps: Optional[float] = None

    def as_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status, "reason": self.reason, "message": self.message}
        if self.transport:
            out["transport"] = self.transport
        if self.gbps is not None:
            out["gBps"] = round(self.gbps, 3)
        return out


def role_transport(pods: Iterable[tuple[str, Optional[PodTransport]]]) -> RoleTransport:
    """(pod name, verdict) of one role's pods at one revision -> the role's verdict."""
    reported = [(name, v) for name, v in sorted(pods, key=lambda p: p[0]) if v is not None]
    bad = [(name, v) for name, v in reported if v.status != "True"]
    if bad:
        name, v = bad[0]
        more = f" (and {len(bad) - 1} more pods)" if len(bad) > 1 else ""
        return RoleTransport("False", v.reason, f"pod {name}{more}: {v.message}", v.transport, v.gbps)
    if not reported:
        return RoleTransport("Unknown", PENDING, "no pod has reported its fabric preflight yet")
    transports = sorted({v.transport for _, v in reported if v.transport})
    rates = [v.gbps for _, v in reported if v.gbps is not None]
    slowest = min(rates) if rates else None
    rate = f" at >= {slowest:.2f} GB/s" if slowest is not None else ""
    return RoleTransport("True", reported[0][1].reason, f"{len(reported)} pods over {', '.join(transports) or 'UCX'}"
                         f"{rate}", ",".join(transports) or None, slowest)


def fleet_transport(roles: Mapping[str, RoleTransport]) -> RoleTransport:
    """The KVTransport condition: the first failing role, else Unknown while one is pending, else True."""
    for want in ("False", "Unknown"):
        for role, rt in roles.items():
            if rt.status == want:
                return RoleTransport(want, rt.reason, f"{role}: {rt.message}", rt.transport, rt.gbps)
    return RoleTransport("True", VERIFIED,
                         "; ".join(f"{role}: {rt.message}" for role, rt in roles.items()),
                         None, min((rt.gbps for rt in roles.values() if rt.gbps is not None), default=None))
