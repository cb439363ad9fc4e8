"""The workloads of one role (pure): a StatefulSet, or LeaderWorkerSets when a replica spans
several pods, with gang objects, placement and the fabric preflight on every pod template."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from pdfleet.contract import labels
from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan import engines, fabric, gang, multinode, naming, placement
from pdfleet.operator.plan.meta import Context


def _pod_templates(workload: dict[str, Any]) -> Iterator[dict[str, Any]]:
    if workload["kind"] == multinode.LWS_KIND:
        lwt = workload["spec"]["leaderWorkerTemplate"]
        yield lwt["leaderTemplate"]
        yield lwt["workerTemplate"]
    else:
        yield workload["spec"]["template"]


def _decorate(ctx: Context, spec: DisaggregatedInferenceSpec, role: str, workload: dict[str, Any],
              group: str | None) -> None:
    for template in _pod_templates(workload):
        placement.apply(template["spec"], spec, ctx.fleet, role, ctx.revision)
        fabric.apply(template["spec"], spec, role)
        gang.decorate_pod(template, spec, role, group)
    gang.decorate_workload(workload, spec)


def workloads(ctx: Context, spec: DisaggregatedInferenceSpec, role: str) -> list[dict[str, Any]]:
    """The role's StatefulSet, or its LeaderWorkerSet(s) and PodGroups."""
    if not multinode.is_multinode(spec, role):
        sts = engines.statefulset(ctx, spec, role)
        _decorate(ctx, spec, role, sts, None)
        return [sts]
    name = naming.role_workload_name(ctx.fleet, role, ctx.revision)
    if not gang.per_group_workloads(spec, role):
        lws = multinode.leaderworkerset(ctx, spec, role, name, spec.role(role).replicas)
        _decorate(ctx, spec, role, lws, None)
        return [lws]
    out: list[dict[str, Any]] = []
    for group in range(spec.role(role).replicas):
        group_name = multinode.group_name(ctx, role, group)
        lws = multinode.leaderworkerset(ctx, spec, role, group_name, 1, group)
        _decorate(ctx, spec, role, lws, group_name)
        out.append(lws)
        pod_group = gang.pod_group(ctx, spec, role, group_name)
        if pod_group is not None:
            out.append(pod_group)
    return out


def headless_service(ctx: Context, spec: DisaggregatedInferenceSpec, role: str, *, serving: bool = True,
                     canary_weight: Optional[int] = None) -> dict[str, Any]:
    """The role's headless Service; ``serving``: this revision serves new requests, and the label
    that says so (which its EndpointSlices carry) is how the router learns it. ``canary_weight``:
    this revision is a canary taking that percent of new requests (the label the router reads)."""
    svc = engines.headless_service(ctx, spec, role)
    if serving:
        svc["metadata"]["labels"][labels.SERVING] = labels.SERVING_TRUE
    elif canary_weight is not None:
        svc["metadata"]["labels"][labels.CANARY_WEIGHT] = str(canary_weight)
    if multinode.is_multinode(spec, role):
        svc["spec"]["selector"] = {**svc["spec"]["selector"], **multinode.leader_selector()}
        local = spec.kv_transfer.side_channel_port + spec.role(role).tensor_parallel_size // spec.role(role).nodes_per_replica
        svc["spec"]["ports"] = [p for p in svc["spec"]["ports"] if p["name"] == engines.HTTP_PORT_NAME or p["port"] < local]
    return svc
