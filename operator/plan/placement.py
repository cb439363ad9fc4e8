"""Topology-aware placement of prefill and decode pods (pure).

`spec.placement.topologyKey` names a node label whose value is one fast-fabric domain
(an NVLink clique, a rack, a zone). Decode pods get pod affinity to the fleet's prefill
pods on that key (required or preferred, `spec.placement.mode`), so the KV cache moves
inside a domain. Prefill pods get no affinity: they are placed first, decode follows,
and a required rule on both sides could leave neither schedulable. Replicas of one
role are spread across nodes (a node failure takes one replica, not several).
A role's own `affinity` is kept; the terms here are added to it.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan import naming

HOSTNAME_KEY = "kubernetes.io/hostname"
PREFERRED_WEIGHT = 100


def decode_affinity_term(fleet: str, topology_key: str) -> dict[str, Any]:
    """'Same topology domain as a prefill pod of this fleet' (any revision: a rollout keeps the pairs close too)."""
    return {"labelSelector": {"matchLabels": naming.selector(fleet, "prefill")}, "topologyKey": topology_key}


def affinity(spec: DisaggregatedInferenceSpec, fleet: str, role: str) -> Optional[dict[str, Any]]:
    """The role's affinity with the placement terms added; None when there is none at all."""
    out = copy.deepcopy(spec.role(role).affinity) if spec.role(role).affinity else {}
    key = spec.placement.topology_key
    if key and role == "decode":
        pod_affinity = out.setdefault("podAffinity", {})
        term = decode_affinity_term(fleet, key)
        if spec.placement.mode == "required":
            pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
        else:
            pod_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
                {"weight": PREFERRED_WEIGHT, "podAffinityTerm": term}
            )
    return out or None


def spread_constraints(spec: DisaggregatedInferenceSpec, fleet: str, role: str, revision: str) -> list[dict[str, Any]]:
    """Spread one role's pods (of one revision) over nodes; soft, so a small cluster still schedules."""
    if not spec.placement.topology_key:
        return []
    return [
        {
            "maxSkew": 1,
            "topologyKey": HOSTNAME_KEY,
            "whenUnsatisfiable": "ScheduleAnyway",
            "labelSelector": {"matchLabels": naming.selector(fleet, role, revision)},
        }
    ]


def apply(pod_spec: dict[str, Any], spec: DisaggregatedInferenceSpec, fleet: str, role: str, revision: str) -> None:
    """Set affinity and spreading on a rendered pod spec (in place)."""
    aff = affinity(spec, fleet, role)
    if aff:
        pod_spec["affinity"] = aff
    spread = spread_constraints(spec, fleet, role, revision)
    if spread:
        pod_spec["topologySpreadConstraints"] = spread
