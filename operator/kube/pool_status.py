"""What the cluster's gateways say about the fleet's InferencePool (its status.parents), and the fleet condition
that sums it up (pure).

A gateway that serves a pool writes `status.parents[]` on it (GAIE v1): per parent (a Gateway) the
conditions `Accepted` and `ResolvedRefs`. The fleet's `InferencePoolAccepted` condition sums them
up, so `kubectl get dinf -o yaml` says whether any gateway took the pool and why not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

CONDITION_TYPE = "InferencePoolAccepted"
PARENT_CONDITIONS = ("Accepted", "ResolvedRefs")  # GAIE's condition types on status.parents[]
MAX_PARENTS = 32  # as GAIE's CRD bounds status.parents


@dataclass(frozen=True)
class ParentCondition:
    parent: str  # the parent's kind/namespace/name, e.g. Gateway/team-a/inference-gateway
    type: str
    status: str  # "True" | "False" | "Unknown"
    reason: str = ""
    message: str = ""


def parse_parents(status: Any) -> tuple[ParentCondition, ...]:
    """The Accepted/ResolvedRefs conditions of a pool's status.parents (malformed entries skipped)."""
    out: list[ParentCondition] = []
    parents = status.get("parents") if isinstance(status, Mapping) else None
    for entry in (parents if isinstance(parents, list) else [])[:MAX_PARENTS]:
        if not isinstance(entry, Mapping) or not isinstance(entry.get("parentRef"), Mapping):
            continue
        ref = entry["parentRef"]
        name = f"{ref.get('kind') or 'Gateway'}/{ref.get('namespace') or '-'}/{ref.get('name') or '?'}"
        for c in entry.get("conditions") or ():
            if isinstance(c, Mapping) and c.get("type") in PARENT_CONDITIONS:
                out.append(ParentCondition(name, str(c["type"]), str(c.get("status") or "Unknown"),
                                           str(c.get("reason") or ""), str(c.get("message") or "")[:256]))
    return tuple(out)


def pool_condition(pool_present: bool, parents: Iterable[ParentCondition]) -> Optional[tuple[str, str, str]]:
    """(status, reason, message) of InferencePoolAccepted; None when the fleet has no pool."""
    if not pool_present:
        return None
    parents = tuple(parents)
    if not parents:
        return ("Unknown", "NoParent", "no gateway reports on the InferencePool yet (an HTTPRoute's backendRef "
                "names it; the gateway must implement the Gateway API Inference Extension)")
    failed = [p for p in parents if p.status == "False"]
    if failed:
        first = failed[0]
        return ("False", first.reason or f"Not{first.type}",
                "; ".join(f"{p.parent}: {p.type}=False ({p.reason}) {p.message}".rstrip() for p in failed))
    names = sorted({p.parent for p in parents})
    done = {(p.parent, p.type) for p in parents if p.status == "True"}
    if all((n, t) in done for n in names for t in PARENT_CONDITIONS):
        return ("True", "Accepted", "accepted by " + ", ".join(names))
    return ("Unknown", "Pending", "waiting for " + ", ".join(
        f"{n} {t}" for n in names for t in PARENT_CONDITIONS if (n, t) not in done))
