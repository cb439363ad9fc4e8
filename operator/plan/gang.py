"""Gang scheduling of multi-node replicas (pure): each replica's pods start together or not at all.

A gang is the pods of ONE replica (a LeaderWorkerSet group: nodesPerReplica pods). A shared
pod template cannot name a per-group PodGroup, so under a gang provider a multi-node role
renders one LeaderWorkerSet per replica (replicas: 1, see multinode.py), and each gets:

- kueue: the pod-group labels of Kueue's plain-pod groups (`kueue.x-k8s.io/pod-group-name`
  + annotation `kueue.x-k8s.io/pod-group-total-count`) and `kueue.x-k8s.io/queue-name`;
  no object (Kueue creates the Workload itself).
- volcano: a `scheduling.volcano.sh/v1beta1` PodGroup with minMember = nodesPerReplica
  (queue = scheduling.queueName), pods annotated `scheduling.k8s.io/group-name` and
  scheduled by `volcano`.
- coscheduling (kubernetes-sigs/scheduler-plugins): a `scheduling.x-k8s.io/v1alpha1`
  PodGroup with minMember = nodesPerReplica, pods labelled `scheduling.x-k8s.io/pod-group`.
  The scheduler that runs the plugin is a cluster choice (often the default scheduler
  reconfigured), so no schedulerName is set.

Single-pod replicas (nodesPerReplica 1) form no gang; under kueue they still carry the
queue-name label so the whole fleet is admitted through the one queue.

Each provider is one `GangProvider` (`PROVIDERS`, keyed by the API's `scheduling.gang.provider`):
what its pods, its workloads and its PodGroup carry, from plain values (pure, table-tested in
tests/unit/plan/test_gang.py). The kinds it creates (`GANG_KINDS`) are what the operator must be
told it may write (`--gang-provider`, the chart's RBAC).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan import kinds, naming
from pdfleet.operator.plan.kinds import Kind
from pdfleet.operator.plan.meta import Context, metadata

KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
VOLCANO_QUEUE_ANNOTATION = "scheduling.volcano.sh/queue-name"
VOLCANO_SCHEDULER = "volcano"
COSCHEDULING_GROUP_LABEL = "scheduling.x-k8s.io/pod-group"
# How long scheduler-plugins waits for a whole group before it gives the pods back.
COSCHEDULING_TIMEOUT_SECONDS = 600


@dataclass(frozen=True)
class PodMeta:
    """What a provider adds to a pod template."""

    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    scheduler_name: Optional[str] = None


@dataclass(frozen=True)
class GangProvider:
    """A gang scheduler as the plan sees it. `group`: the gang's name (one replica's pods), or None
    for a single-pod replica (no gang); `size`: pods per gang; `queue`: scheduling.queueName."""

    name: str = "none"
    pod_group_kind: Optional[Kind] = None   # the object the operator creates per gang, if any

    def pod_meta(self, group: Optional[str], size: int, queue: Optional[str]) -> PodMeta:
        return PodMeta()

    def workload_labels(self, queue: Optional[str]) -> dict[str, str]:
        return {}

    def pod_group_spec(self, size: int, queue: Optional[str]) -> Optional[dict[str, Any]]:
        return None


class Kueue(GangProvider):
    """Kueue's plain-pod groups: labels only, Kueue creates the Workload itself."""

    def pod_meta(self, group: Optional[str], size: int, queue: Optional[str]) -> PodMeta:
        if group is None:
            return PodMeta(labels={KUEUE_QUEUE_LABEL: queue or ""})
        return PodMeta(labels={KUEUE_QUEUE_LABEL: queue or "", KUEUE_GROUP_LABEL: group},
                       annotations={KUEUE_COUNT_ANNOTATION: str(size)})

    def workload_labels(self, queue: Optional[str]) -> dict[str, str]:
        return {KUEUE_QUEUE_LABEL: queue or ""}


class Volcano(GangProvider):
    def pod_meta(self, group: Optional[str], size: int, queue: Optional[str]) -> PodMeta:
        annotations = {VOLCANO_GROUP_ANNOTATION: group} if group else {}
        if queue:
            annotations[VOLCANO_QUEUE_ANNOTATION] = queue
        return PodMeta(annotations=annotations, scheduler_name=VOLCANO_SCHEDULER)

    def pod_group_spec(self, size: int, queue: Optional[str]) -> Optional[dict[str, Any]]:
        return {"minMember": size, **({"queue": queue} if queue else {})}


class Coscheduling(GangProvider):
    """scheduler-plugins: the scheduler that runs the plugin is a cluster choice, so no schedulerName."""

    def pod_meta(self, group: Optional[str], size: int, queue: Optional[str]) -> PodMeta:
        return PodMeta(labels={COSCHEDULING_GROUP_LABEL: group} if group else {})

    def pod_group_spec(self, size: int, queue: Optional[str]) -> Optional[dict[str, Any]]:
        return {"minMember": size, "scheduleTimeoutSeconds": COSCHEDULING_TIMEOUT_SECONDS}


PROVIDERS: dict[str, GangProvider] = {p.name: p for p in (
    GangProvider(),
    Kueue("kueue"),
    Volcano("volcano", kinds.VOLCANO_PODGROUP),
    Coscheduling("coscheduling", kinds.COSCHEDULING_PODGROUP),
)}
# Providers whose PodGroups the operator writes: it must be told they are installed.
GANG_KINDS: dict[str, Kind] = {name: p.pod_group_kind for name, p in PROVIDERS.items() if p.pod_group_kind}


def provider(spec: DisaggregatedInferenceSpec) -> GangProvider:
    return PROVIDERS[spec.scheduling.gang.provider]


def per_group_workloads(spec: DisaggregatedInferenceSpec, role: str) -> bool:
    """One LeaderWorkerSet per replica: needed for a per-replica gang of a multi-node role."""
    return provider(spec).name != "none" and spec.role(role).nodes_per_replica > 1


def decorate_pod(template: dict[str, Any], spec: DisaggregatedInferenceSpec, role: str, group: str | None) -> None:
    """Add the gang's pod metadata to a pod template (in place). `group`: the gang's name, or None (no gang)."""
    add = provider(spec).pod_meta(group, spec.role(role).nodes_per_replica, spec.scheduling.queue_name)
    meta = template.setdefault("metadata", {})
    meta.setdefault("labels", {}).update(add.labels)
    annotations = meta.setdefault("annotations", {})
    annotations.update(add.annotations)
    if add.scheduler_name:
        template["spec"]["schedulerName"] = add.scheduler_name
    if not annotations:
        meta.pop("annotations")


def decorate_workload(workload: dict[str, Any], spec: DisaggregatedInferenceSpec) -> None:
    workload["metadata"]["labels"].update(provider(spec).workload_labels(spec.scheduling.queue_name))


def pod_group(ctx: Context, spec: DisaggregatedInferenceSpec, role: str, group: str) -> dict[str, Any] | None:
    """The PodGroup object of one gang, or None when the provider needs none (kueue)."""
    gang = provider(spec)
    body = gang.pod_group_spec(spec.role(role).nodes_per_replica, spec.scheduling.queue_name)
    if body is None or gang.pod_group_kind is None:
        return None
    labels = naming.revision_labels(ctx.fleet, role, ctx.revision)
    return {"apiVersion": gang.pod_group_kind.api_version, "kind": gang.pod_group_kind.kind,
            "metadata": metadata(ctx, group, labels), "spec": body}
