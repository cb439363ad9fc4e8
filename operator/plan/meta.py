"""What every child's metadata needs: the fleet, its namespace, revision and owner."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass(frozen=True)
class Context:
    fleet: str
    namespace: str
    revision: str
    image: str
    owner: Optional[dict[str, Any]] = None


def metadata(ctx: Context, name: str, labels: dict[str, str]) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ctx.namespace, "labels": dict(labels)}
    if ctx.owner:
        meta["ownerReferences"] = [dict(ctx.owner)]
    return meta


def owner_reference(resource: dict[str, Any]) -> dict[str, Any]:
    """The controller owner reference to a DisaggregatedInference read from the API."""
    meta = resource.get("metadata") or {}
    if not meta.get("uid"):
        raise ValueError("metadata.uid: an owner reference needs the resource's uid (read it from the API server)")
    return {
        "apiVersion": resource["apiVersion"],
        "kind": resource["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
