"""What the operator's watches observed about its children and pods (pure parsing).

A `ChildRef` names an object; `observe_child` / `observe_pod` turn a watched body into the
frozen record the reconciler diffs and the scalers' and planner's edges read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from pdfleet.contract import fabric
from pdfleet.contract import labels as label_keys
from pdfleet.operator.kube.pod_causes import PodCause, pod_cause
from pdfleet.operator.kube.pool_status import ParentCondition, parse_parents
from pdfleet.operator.plan.kinds import INFERENCE_POOL, OWNED_KINDS, POD_GROUP_KINDS, Kind

ROLE_LABEL = label_keys.ROLE
REVISION_LABEL = label_keys.REVISION
HASH_ANNOTATION = label_keys.APPLIED_HASH
SERVING_LABEL, SERVING_TRUE = label_keys.SERVING, label_keys.SERVING_TRUE
LWS_WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LWS_NAME_LABEL = "leaderworkerset.sigs.k8s.io/name"
# Set by Kubernetes' controllers on the pods they make: which template (Deployment) or revision
# (StatefulSet) a pod was made from.
POD_TEMPLATE_HASH_LABEL = "pod-template-hash"
CONTROLLER_REVISION_HASH_LABEL = "controller-revision-hash"
PREFLIGHT_CONTAINER = fabric.CONTAINER_NAME
_BY_KIND = {(k.api_version, k.kind): k for k in (*OWNED_KINDS, *POD_GROUP_KINDS)}


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


@dataclass(frozen=True)
class PodTransport:
    """One pod's verdict."""

    status: str          # "True" | "False"
    reason: str
    message: str
    transport: Optional[str] = None
    gbps: Optional[float] = None


def from_pod_status(status: Mapping[str, Any]) -> Optional[PodTransport]:
    """The verdict the pod's preflight wrote, or None (not run yet, disabled, or unreadable)."""
    for cs in status.get("initContainerStatuses") or []:
        if cs.get("name") != PREFLIGHT_CONTAINER:
            continue
        terminated = ((cs.get("state") or {}).get("terminated") or (cs.get("lastState") or {}).get("terminated")
                      or {})
        message = terminated.get("message")
        verdict = fabric.parse_verdict(message if isinstance(message, str) else None)
        if verdict is None:
            return None
        return PodTransport("True" if verdict.status else "False", verdict.reason, verdict.message,
                            verdict.transport, verdict.gbps)
    return None

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
    controller_uid: str = ""       # uid of the controller ownerReference
    revisions: tuple[str, ...] = ()   # a StatefulSet's status.currentRevision / updateRevision
    labels: tuple[tuple[str, str], ...] = ()
    pool_parents: tuple[ParentCondition, ...] = ()  # an InferencePool's status.parents (the gateways' word)


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
    controller: Optional[tuple[str, str, str]] = None  # (kind, name, uid) of the controller ownerReference
    uid: str = ""
    template_hash: Optional[str] = None            # pod-template-hash (a Deployment's pods)
    revision_hash: Optional[str] = None            # controller-revision-hash (a StatefulSet's pods)
    lws_name: Optional[str] = None                 # the LeaderWorkerSet that made it, by its label
    cause: Optional[PodCause] = None               # why it does not run (kube/pod_causes.py), None: no cause


@dataclass(frozen=True)
class ObservedReplicaSet:
    """A ReplicaSet of one of the fleet's Deployments (the link from a router pod to its Deployment)."""

    namespace: str
    name: str
    uid: str
    controller_uid: str = ""
    template_hash: Optional[str] = None


def _int(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def controller_of(meta: Mapping[str, Any]) -> Optional[tuple[str, str, str]]:
    """(kind, name, uid) of the controller ownerReference, or None."""
    refs = meta.get("ownerReferences")
    for ref in refs if isinstance(refs, list) else ():
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return str(ref.get("kind") or ""), str(ref.get("name") or ""), str(ref.get("uid") or "")
    return None


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
        controller_uid=(controller_of(meta) or ("", "", ""))[2],
        revisions=tuple(sorted({str(status[k]) for k in ("currentRevision", "updateRevision") if status.get(k)})),
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        pool_parents=parse_parents(status) if body.get("kind") == INFERENCE_POOL.kind else (),
    )


def observe_replicaset(body: Mapping[str, Any]) -> ObservedReplicaSet:
    meta = body.get("metadata") or {}
    labels = meta.get("labels") or {}
    return ObservedReplicaSet(namespace=meta.get("namespace") or "", name=meta.get("name") or "",
                              uid=meta.get("uid") or "", controller_uid=(controller_of(meta) or ("", "", ""))[2],
                              template_hash=labels.get(POD_TEMPLATE_HASH_LABEL))


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
        controller=controller_of(meta),
        uid=meta.get("uid") or "",
        template_hash=labels.get(POD_TEMPLATE_HASH_LABEL),
        revision_hash=labels.get(CONTROLLER_REVISION_HASH_LABEL),
        lws_name=labels.get(LWS_NAME_LABEL),
        cause=pod_cause(status),
    )


