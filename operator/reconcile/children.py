"""Child objects: what kinds the operator owns, how it fingerprints what it applied,
what it observed, and which writes bring the observed set to the desired one (pure).

Level-based comparison without reading the API: every applied child carries the
annotation `pdfleet.io/applied-hash`, the hash of the manifest the operator sent.
A child whose observed annotation equals the desired hash needs no write, so a
resync with nothing changed sends no request at all.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional

from pdfleet.contract import labels as label_keys
from pdfleet.operator.plan import kinds
from pdfleet.operator.plan.kinds import GANG_KINDS, LWS, OWNED_KINDS, POD, Kind
from pdfleet.operator.reconcile.kvtransport import PodTransport, from_pod_status

FLEET_LABEL = label_keys.FLEET
ROLE_LABEL = label_keys.ROLE
REVISION_LABEL = label_keys.REVISION
HASH_ANNOTATION = label_keys.APPLIED_HASH
SERVING_LABEL, SERVING_TRUE = label_keys.SERVING, label_keys.SERVING_TRUE
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
FIELD_MANAGER = "pdfleet"


WORKLOAD_KINDS = kinds.WORKLOAD_KINDS
# The kinds live in plan/kinds.py; these names stay importable from here for the reconciler.
__all__ = ["GANG_KINDS", "LWS", "OWNED_KINDS", "POD", "WORKLOAD_KINDS", "Kind", "ChildRef", "ObservedChild",
           "ObservedPod", "Actions", "diff", "kind_of", "observe_child", "observe_pod", "owner_reference", "stamp",
           "manifest_hash"]
_BY_KIND = {(k.api_version, k.kind): k for k in (*OWNED_KINDS, *GANG_KINDS.values())}


def kind_of(obj: Mapping[str, Any]) -> Kind:
    try:
        return _BY_KIND[(obj["apiVersion"], obj["kind"])]
    except KeyError:
        raise ValueError(f"the operator does not manage {obj.get('apiVersion')}/{obj.get('kind')}") from None


@dataclass(frozen=True, order=True)
class ChildRef:
    api_version: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, obj: Mapping[str, Any], namespace: Optional[str] = None) -> "ChildRef":
        meta = obj.get("metadata") or {}
        return cls(obj["apiVersion"], obj["kind"], meta.get("namespace") or namespace or "", meta["name"])

    def __str__(self) -> str:
        return f"{self.kind}/{self.name}"


def manifest_hash(obj: Mapping[str, Any]) -> str:
    """Hash of a manifest as sent, the hash annotation itself excluded."""
    meta = dict(obj.get("metadata") or {})
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != HASH_ANNOTATION}
    meta["annotations"] = annotations
    canonical = json.dumps({**obj, "metadata": meta}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def owner_reference(cr: Mapping[str, Any]) -> dict[str, Any]:
    meta = cr["metadata"]
    return {
        "apiVersion": cr["apiVersion"],
        "kind": cr["kind"],
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def stamp(obj: Mapping[str, Any], owner: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The manifest to apply: namespace set, controller owner reference to the CR, hash annotation."""
    out = json.loads(json.dumps(obj))
    meta = out.setdefault("metadata", {})
    if kind_of(out).namespaced:
        meta["namespace"] = namespace
    refs = [r for r in meta.get("ownerReferences") or [] if r.get("uid") != owner.get("uid")]
    meta["ownerReferences"] = [dict(owner), *refs]
    annotations = dict(meta.get("annotations") or {})
    annotations.pop(HASH_ANNOTATION, None)
    meta["annotations"] = annotations
    annotations[HASH_ANNOTATION] = manifest_hash(out)
    return out


@dataclass(frozen=True)
class ObservedChild:
    """What the watch said about one child: enough to diff and to compute status."""

    ref: ChildRef
    uid: str = ""
    applied_hash: Optional[str] = None
    owner_uids: tuple[str, ...] = ()
    role: Optional[str] = None
    revision: Optional[str] = None
    deleting: bool = False
    generation: int = 0
    replicas: int = 0              # spec.replicas (workloads)
    observed_generation: int = 0   # status.observedGeneration (workloads)
    status_replicas: int = 0
    ready_replicas: int = 0
    updated_replicas: int = 0
    ports: tuple[tuple[str, int], ...] = ()   # named container ports of a workload's pod template
    serving: bool = False          # labelled as the serving revision's (engine Services)


@dataclass(frozen=True)
class ObservedPod:
    namespace: str
    name: str
    role: Optional[str]
    revision: Optional[str]
    ip: Optional[str]
    ready: bool
    deleting: bool
    ports: tuple[tuple[str, int], ...] = ()
    worker: bool = False                           # a LeaderWorkerSet worker: no API, no side channel of record
    kv_transport: Optional[PodTransport] = None    # the fabric preflight's verdict


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _template_ports(spec: Mapping[str, Any]) -> tuple[tuple[str, int], ...]:
    ports = []
    for container in spec.get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") and port.get("containerPort"):
                ports.append((str(port["name"]), _int(port["containerPort"])))
    return tuple(ports)


def observe_child(body: Mapping[str, Any]) -> ObservedChild:
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    spec = body.get("spec") or {}
    status = body.get("status") or {}
    template_spec = ((spec.get("template") or {}).get("spec") or {}) if isinstance(spec, Mapping) else {}
    if isinstance(spec, Mapping) and "leaderWorkerTemplate" in spec:  # a LeaderWorkerSet: the leader serves
        template_spec = ((spec["leaderWorkerTemplate"] or {}).get("leaderTemplate") or {}).get("spec") or {}
    return ObservedChild(
        ref=ChildRef.of(body),
        uid=meta.get("uid") or "",
        applied_hash=(meta.get("annotations") or {}).get(HASH_ANNOTATION),
        owner_uids=tuple(r.get("uid", "") for r in meta.get("ownerReferences") or []),
        role=labels.get(ROLE_LABEL),
        revision=labels.get(REVISION_LABEL),
        deleting=bool(meta.get("deletionTimestamp")),
        generation=_int(meta.get("generation")),
        replicas=_int(spec.get("replicas", 1))
        if isinstance(spec, Mapping) and ("template" in spec or "leaderWorkerTemplate" in spec) else 0,
        observed_generation=_int(status.get("observedGeneration")),
        status_replicas=_int(status.get("replicas")),
        ready_replicas=_int(status.get("readyReplicas")),
        updated_replicas=_int(status.get("updatedReplicas")),
        ports=_template_ports(template_spec),
        serving=labels.get(SERVING_LABEL) == SERVING_TRUE,
    )


def observe_pod(body: Mapping[str, Any]) -> ObservedPod:
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = body.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return ObservedPod(
        namespace=meta.get("namespace") or "",
        name=meta.get("name") or "",
        role=labels.get(ROLE_LABEL),
        revision=labels.get(REVISION_LABEL),
        ip=status.get("podIP") or None,
        ready=ready and status.get("phase", "Running") == "Running",
        deleting=bool(meta.get("deletionTimestamp")),
        ports=_template_ports(body.get("spec") or {}),
        worker=labels.get(LWS_WORKER_INDEX_LABEL, "0") != "0",
        kv_transport=from_pod_status(status),
    )


@dataclass(frozen=True)
class Actions:
    apply: tuple[dict[str, Any], ...] = ()
    delete: tuple[ObservedChild, ...] = ()
    unchanged: int = 0

    @property
    def writes(self) -> int:
        return len(self.apply) + len(self.delete)


def _replicas_drifted(desired: Mapping[str, Any], have: ObservedChild) -> bool:
    """The one field people change by hand on workloads: put it back even though the hash matches."""
    if desired.get("kind") not in WORKLOAD_KINDS or have.deleting:
        return False
    want = (desired.get("spec") or {}).get("replicas")
    return want is not None and have.replicas != int(want)


def diff(
    desired: Iterable[Mapping[str, Any]],
    observed: Iterable[ObservedChild],
    *,
    owner_uid: str,
    keep_revisions: Iterable[str] = (),
    recently_applied: Mapping[ChildRef, str] = {},
    current_revision: Optional[str] = None,
) -> Actions:
    """Writes that turn `observed` into `desired`.

    Apply a desired child when its observed hash differs (or it is missing or being deleted).
    Delete an observed child this CR controls when the plan no longer has it, unless it belongs
    to a revision in `keep_revisions` (the old pair during a paired rollout). Children of
    `current_revision` the plan no longer has are deleted even though it is kept (a scaled-down
    per-replica LeaderWorkerSet and its PodGroup, a workload whose kind changed).
    `recently_applied` covers applies whose watch event has not arrived yet.
    """
    keep = set(keep_revisions)
    seen = {o.ref: o for o in observed}
    to_apply = []
    unchanged = 0
    wanted = set()
    for obj in desired:
        ref = ChildRef.of(obj)
        wanted.add(ref)
        want = (obj.get("metadata") or {}).get("annotations", {}).get(HASH_ANNOTATION)
        have = seen.get(ref)
        if have is not None and _replicas_drifted(obj, have) and recently_applied.get(ref) != want:
            to_apply.append(dict(obj))  # scaled by hand or by an autoscaler: the spec wins
        elif have is not None and not have.deleting and (have.applied_hash == want or
                                                         (recently_applied.get(ref) == want and have.applied_hash is not None)):
            unchanged += 1
        elif have is None and recently_applied.get(ref) == want:
            unchanged += 1  # applied a moment ago; its ADDED event is on its way
        else:
            to_apply.append(dict(obj))
    to_delete = tuple(
        o for ref, o in sorted(seen.items())
        if ref not in wanted and not o.deleting and owner_uid in o.owner_uids
        and (o.revision not in keep or (current_revision is not None and o.revision == current_revision))
    )
    return Actions(apply=tuple(to_apply), delete=to_delete, unchanged=unchanged)
