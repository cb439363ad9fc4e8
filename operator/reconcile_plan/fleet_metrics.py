"""What the operator exports about each fleet, from the status it computed (pure).

The gauges follow kube-state-metrics' shape: one series per (role, state) for replicas,
one per condition type with `status="true"|"false"` set to 1 or 0, and an `_info`
series per fleet naming its serving revision. Labels stay bounded: roles, states and
condition types are fixed sets; a fleet has one serving revision at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

ROLES = ("prefill", "decode", "router")
# status field per replica state; "desired" comes from the spec.
REPLICA_STATES = {"replicas": "replicas", "ready": "readyReplicas", "updated": "updatedReplicas"}


@dataclass(frozen=True)
class FleetSeries:
    replicas: dict[tuple[str, str], float] = field(default_factory=dict)   # (role, state) -> count
    conditions: dict[str, bool] = field(default_factory=dict)              # type -> status
    revision: Optional[str] = None


def fleet_series(status: Mapping[str, Any], desired: Mapping[str, int]) -> FleetSeries:
    """The series of one fleet: replicas per role and state, conditions, serving revision."""
    replicas: dict[tuple[str, str], float] = {}
    for role in ROLES:
        if role not in desired and role not in status:
            continue
        replicas[(role, "desired")] = float(desired.get(role, 0))
        observed = status.get(role) or {}
        for state, key in REPLICA_STATES.items():
            replicas[(role, state)] = float(observed.get(key, 0) or 0)
    conditions = {str(c["type"]): c.get("status") == "True"
                  for c in status.get("conditions") or [] if isinstance(c, Mapping) and c.get("type")}
    revision = status.get("revision")
    return FleetSeries(replicas, conditions, str(revision) if revision else None)
