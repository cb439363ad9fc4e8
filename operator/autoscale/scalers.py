"""A fleet's scalers (pure): observed scalers + spec -> applied replicas and the writes to make.

A role with `autoscaling` has a DisaggregatedInferenceScaler `<fleet>-<role>`. Its
`.spec.replicas` is owned by whoever scales (HPA, KEDA, kubectl scale, the planner): the
operator writes it only when it creates the scaler (the CR's replicas is the starting
size) and never after, so a Git change of the CR's replicas does not fight the autoscaler.
The operator clamps the scalers' values (clamp.py), renders the plan with them (replicas
are not part of the revision hash, so scaling never starts a rollout) and reports the
result in each scaler's status and the fleet's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Optional, Sequence

from pdfleet.operator.api import DisaggregatedInference
from pdfleet.operator.api import scaler as scaler_api
from pdfleet.operator.api.rules import replica_range
from pdfleet.operator.autoscale.clamp import Bounds, Clamped, Ratio, clamp
from pdfleet.operator.plan import naming
from pdfleet.contract.labels import FLEET as FLEET_LABEL
from pdfleet.contract.labels import ROLE as ROLE_LABEL
from pdfleet.operator.plan.kinds import STATEFULSET, Kind
from pdfleet.operator.kube.observed import ObservedChild

ROLES = ("prefill", "decode")
# The ScalingLimited condition's message (and the event's) while no scaler's replicas is clamped.
WITHIN_BOUNDS = "every scaler's replicas is applied as asked"
SCALER_KIND = Kind(scaler_api.API_VERSION, scaler_api.KIND, scaler_api.PLURAL)


@dataclass(frozen=True)
class ObservedScaler:
    namespace: str
    name: str
    role: Optional[str]
    uid: str = ""
    owner_uids: tuple[str, ...] = ()
    replicas: Optional[int] = None      # .spec.replicas
    generation: int = 0
    deleting: bool = False
    status: tuple[tuple[str, Any], ...] = ()

    def status_dict(self) -> dict[str, Any]:
        return dict(self.status)


def observe_scaler(body: Mapping[str, Any]) -> ObservedScaler:
    meta = body.get("metadata") or {}
    spec = body.get("spec") or {}
    replicas = spec.get("replicas")
    return ObservedScaler(
        namespace=meta.get("namespace") or "",
        name=meta.get("name") or "",
        role=(meta.get("labels") or {}).get(ROLE_LABEL),
        uid=meta.get("uid") or "",
        owner_uids=tuple(r.get("uid", "") for r in meta.get("ownerReferences") or []),
        replicas=replicas if isinstance(replicas, int) and not isinstance(replicas, bool) else None,
        generation=int(meta.get("generation") or 0),
        deleting=bool(meta.get("deletionTimestamp")),
        status=tuple(sorted((body.get("status") or {}).items())),
    )


def pod_selector(fleet: str, role: str) -> str:
    """Pods of the role across revisions: what an HPA averages its pod metrics over."""
    return ",".join(f"{k}={v}" for k, v in naming.selector(fleet, role).items())


def scaler_manifest(fleet: str, namespace: str, role: str, replicas: int, owner: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": scaler_api.API_VERSION,
        "kind": scaler_api.KIND,
        "metadata": {
            "name": scaler_api.scaler_name(fleet, role),
            "namespace": namespace,
            "labels": naming.role_labels(fleet, role),
            "ownerReferences": [dict(owner)],
        },
        "spec": {"replicas": replicas},
    }


@dataclass(frozen=True)
class ScalingPlan:
    autoscaled: tuple[str, ...] = ()
    result: Optional[Clamped] = None
    create: tuple[dict[str, Any], ...] = ()
    delete: tuple[ObservedScaler, ...] = ()
    status_patches: tuple[tuple[str, dict[str, Any]], ...] = ()   # (scaler name, new status)

    @property
    def active(self) -> bool:
        return bool(self.autoscaled)

    def applied(self, cr: DisaggregatedInference) -> DisaggregatedInference:
        """The CR with the clamped replicas in place of the spec's (for the plan only)."""
        if self.result is None:
            return cr
        spec = cr.spec.model_copy(update={
            role: cr.spec.role(role).model_copy(update={"replicas": self.result.replicas[role]}) for role in ROLES
        })
        return cr.model_copy(update={"spec": spec})

    def fleet_status(self) -> Optional[dict[str, Any]]:
        if self.result is None:
            return None
        return {role: {"requestedReplicas": self.result.requested[role], "replicas": self.result.replicas[role],
                       "reason": self.result.reasons.get(role, "")} for role in self.autoscaled}

    def clamp_summary(self) -> str:
        if self.result is None:
            return ""
        return "; ".join(f"{role} {self.result.requested[role]} -> {self.result.replicas[role]} "
                         f"({self.result.reasons[role]})" for role in ROLES if role in self.result.reasons)


def scaling_condition(plan: ScalingPlan) -> Optional[tuple[bool, str, str]]:
    """(status, reason, message) of the fleet's ScalingLimited condition; None without autoscaling."""
    if not plan.active:
        return None
    summary = plan.clamp_summary()
    if summary:
        return True, "Clamped", summary
    return False, "WithinBounds", WITHIN_BOUNDS


def _current_size(children: Iterable[ObservedChild], role: str, revision: str) -> Optional[int]:
    """A StatefulSet's replicas for this role: the target revision's, else any revision's."""
    sizes = {c.revision: c.replicas for c in children if c.ref.kind == STATEFULSET.kind and c.role == role and not c.deleting}
    if revision in sizes:
        return sizes[revision]
    return max(sizes.values()) if sizes else None


def plan_scaling(cr: DisaggregatedInference, scalers: Sequence[ObservedScaler], children: Sequence[ObservedChild], *,
                 owner: Mapping[str, Any], namespace: str, revision: str) -> ScalingPlan:
    spec = cr.spec
    fleet = cr.metadata.name
    uid = owner.get("uid", "")
    autoscaled = tuple(r for r in ROLES if spec.role(r).autoscaling is not None)
    mine = {s.role: s for s in scalers if uid in s.owner_uids and not s.deleting and s.namespace == namespace
            and s.name == scaler_api.scaler_name(fleet, s.role or "")}
    delete = tuple(s for s in scalers if uid in s.owner_uids and not s.deleting and s.role not in autoscaled)
    if not autoscaled:
        return ScalingPlan(delete=delete)

    requested: dict[str, int] = {}
    create = []
    for role in ROLES:
        if role not in autoscaled:
            requested[role] = spec.role(role).replicas
            continue
        have = mine.get(role)
        if have is not None and have.replicas is not None:
            requested[role] = have.replicas
        else:
            # A new scaler starts at the CR's replicas; a recreated one at the role's current size,
            # so that deleting a scaler never makes the fleet jump.
            size = _current_size(children, role, revision)
            requested[role] = spec.role(role).replicas if size is None else size
            if have is None:
                create.append(scaler_manifest(fleet, namespace, role, requested[role], owner))
    bounds = {role: Bounds(*replica_range(spec.role(role))) for role in ROLES}
    ratio = Ratio(spec.scaling.ratio.min, spec.scaling.ratio.max) if spec.scaling.ratio else Ratio()
    result = clamp(requested, bounds, ratio)

    patches = []
    for role in autoscaled:
        have = mine.get(role)
        if have is None:
            continue
        status = {
            "observedGeneration": have.generation,
            "replicas": result.replicas[role],
            "selector": pod_selector(fleet, role),
            "requestedReplicas": result.requested[role],
            "clamped": role in result.reasons,
            "reason": result.reasons.get(role, ""),
        }
        if have.status_dict() != status:
            patches.append((have.name, status))
    return ScalingPlan(autoscaled, result, tuple(create), delete, tuple(patches))


__all__ = [
    "FLEET_LABEL", "ObservedScaler", "SCALER_KIND", "ScalingPlan", "observe_scaler", "plan_scaling", "pod_selector",
    "scaler_manifest",
]
