"""Child objects: how the operator fingerprints what it applies, and which writes bring the
observed set to the desired one (pure). What a watch observed is parsed in kube/observed.py.

Level-based comparison without reading the API: every applied child carries the
annotation `pdfleet.io/applied-hash`, the hash of the manifest the operator sent.
A child whose observed annotation equals the desired hash needs no write, so a
resync with nothing changed sends no request at all.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional

from pdfleet.contract import labels as label_keys
from pdfleet.operator.kube.observed import (
    HASH_ANNOTATION, LWS_WORKER_INDEX_LABEL, REVISION_LABEL, ROLE_LABEL, SERVING_LABEL, SERVING_TRUE, ChildRef,
    ObservedChild, ObservedPod, kind_of, observe_child, observe_pod,
)
from pdfleet.operator.plan import kinds
from pdfleet.operator.plan.gang import GANG_KINDS
from pdfleet.operator.plan.kinds import LWS, OWNED_KINDS, POD, Kind

FLEET_LABEL = label_keys.FLEET
WORKLOAD_KINDS = kinds.WORKLOAD_KINDS
# The kinds (plan/kinds.py) and the observed records (kube/observed.py) stay importable from
# here: the reconciler's modules read them as `ch.*`.
__all__ = ["GANG_KINDS", "LWS", "OWNED_KINDS", "POD", "WORKLOAD_KINDS", "Kind", "ChildRef", "ObservedChild",
           "ObservedPod", "Actions", "diff", "kind_of", "observe_child", "observe_pod", "owner_reference", "stamp",
           "manifest_hash", "FLEET_LABEL", "ROLE_LABEL", "REVISION_LABEL", "HASH_ANNOTATION", "SERVING_LABEL",
           "SERVING_TRUE", "LWS_WORKER_INDEX_LABEL", "stray_labels", "strip_labels_patch"]


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
class Actions:
    apply: tuple[dict[str, Any], ...] = ()
    delete: tuple[ObservedChild, ...] = ()
    unchanged: int = 0
    # labels of the fleet's own keys (pdfleet.io/...) that the plan does not set, put on by hand:
    # a canary weight on a Service would steer the router, so they come off (a merge patch each)
    strip: tuple[tuple[ObservedChild, tuple[str, ...]], ...] = ()

    @property
    def writes(self) -> int:
        return len(self.apply) + len(self.delete)


def _replicas_drifted(desired: Mapping[str, Any], have: ObservedChild) -> bool:
    """The one field people change by hand on workloads: put it back even though the hash matches."""
    if desired.get("kind") not in WORKLOAD_KINDS or have.deleting:
        return False
    want = (desired.get("spec") or {}).get("replicas")
    return want is not None and have.replicas != int(want)


def _labels_drifted(desired: Mapping[str, Any], have: ObservedChild) -> bool:
    """A label the plan sets was changed or removed by hand (e.g. a Service's canary weight, which the
    router obeys): put it back even though the hash matches. Labels the plan does not set are left alone."""
    want = (desired.get("metadata") or {}).get("labels") or {}
    if have.deleting or not want:
        return False
    labels = dict(have.labels)
    return any(labels.get(k) != v for k, v in want.items())


def stray_labels(desired: Mapping[str, Any], have: ObservedChild) -> tuple[str, ...]:
    """The fleet's label keys on a child that the plan does not set (the operator owns that key space
    on its children; anyone else's labels are left alone)."""
    if have.deleting:
        return ()
    want = (desired.get("metadata") or {}).get("labels") or {}
    return tuple(sorted(k for k, _ in have.labels if k.startswith(label_keys.PREFIX) and k not in want))


def strip_labels_patch(keys: Iterable[str]) -> dict[str, Any]:
    """Merge patch taking ``keys`` off an object's labels."""
    return {"metadata": {"labels": {k: None for k in keys}}}


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
    strip = []
    for obj in desired:
        ref = ChildRef.of(obj)
        wanted.add(ref)
        want = (obj.get("metadata") or {}).get("annotations", {}).get(HASH_ANNOTATION)
        have = seen.get(ref)
        if have is not None and (stray := stray_labels(obj, have)):
            strip.append((have, stray))
        if (have is not None and (_replicas_drifted(obj, have) or _labels_drifted(obj, have))
                and recently_applied.get(ref) != want):
            to_apply.append(dict(obj))  # scaled or relabelled by hand (or by an autoscaler): the spec wins
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
    return Actions(apply=tuple(to_apply), delete=to_delete, unchanged=unchanged, strip=tuple(strip))
