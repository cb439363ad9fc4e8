"""A role whose replica spans several pods (nodesPerReplica > 1): a LeaderWorkerSet (pure).

`leaderworkerset.x-k8s.io/v1`, group size = nodesPerReplica. vLLM 0.32 runs one engine
across nodes with its own multiprocessing launcher (no Ray): every node starts with
`--nnodes N --node-rank R --master-addr <leader> --master-port P`, the leader (rank 0)
runs the OpenAI API server, the scheduler and the KV side channel, and the other nodes
run `vllm serve --headless` (GPU workers only, which join the leader's torch.distributed
group). LeaderWorkerSet injects LWS_LEADER_ADDRESS and LWS_WORKER_INDEX (= node rank)
into every container; Kubernetes expands `$(VAR)` in args from them.

Each pod gets its share of the role's GPUs (tensorParallelSize / nodesPerReplica) and
the RDMA resources. The role's headless Service selects leaders only (worker-index 0):
handshakes and status.endpoints name the leader, which the router sends requests to.
"""

from __future__ import annotations

import copy
from typing import Any, Optional

from pdfleet.operator.api.rules import ranks_per_pod
from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan import kinds, naming
from pdfleet.operator.plan.engines import HTTP_PORT_NAME, SIDE_CHANNEL_PORT_NAME, pod_template
from pdfleet.operator.plan.meta import Context, metadata

LWS_API = kinds.LWS.api_version
LWS_KIND = kinds.LWS.kind
WORKER_INDEX_LABEL = "leaderworkerset.sigs.k8s.io/worker-index"
LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"
WORKER_INDEX_ENV = "LWS_WORKER_INDEX"
MASTER_PORT = 29501  # vLLM's default torch.distributed port for --nnodes
MASTER_PORT_NAME = "dist-master"
WORKER_MODULE = "vllm.entrypoints.cli.main"  # `vllm serve --headless` as a module


def is_multinode(spec: DisaggregatedInferenceSpec, role: str) -> bool:
    return spec.role(role).nodes_per_replica > 1


def leader_selector() -> dict[str, str]:
    """Added to the role's headless Service selector: only leaders carry the side channel and the API."""
    return {WORKER_INDEX_LABEL: "0"}


def multinode_args(spec: DisaggregatedInferenceSpec, role: str, node_rank: str) -> list[str]:
    return [
        "--nnodes", str(spec.role(role).nodes_per_replica),
        "--node-rank", node_rank,
        "--master-addr", f"$({LEADER_ADDRESS_ENV})",
        "--master-port", str(MASTER_PORT),
        "--distributed-executor-backend", "mp",
    ]  # fmt: skip


def _worker_ports(spec: DisaggregatedInferenceSpec, role: str) -> list[dict[str, Any]]:
    """Side-channel ports of the TP ranks a worker pod may run (every rank past the leader's)."""
    base = spec.kv_transfer.side_channel_port
    first, tp = ranks_per_pod(spec.role(role)), spec.role(role).tensor_parallel_size
    return [
        {"name": f"{SIDE_CHANNEL_PORT_NAME}-{r}", "containerPort": base + r, "protocol": "TCP"} for r in range(first, tp)
    ]


def leader_template(ctx: Context, spec: DisaggregatedInferenceSpec, role: str) -> dict[str, Any]:
    template = pod_template(ctx, spec, role)
    container = template["spec"]["containers"][0]
    container["args"] = container["args"] + multinode_args(spec, role, "0")
    local = ranks_per_pod(spec.role(role))
    container["ports"] = [
        p for p in container["ports"]
        if p["name"] == HTTP_PORT_NAME or p["containerPort"] < spec.kv_transfer.side_channel_port + local
    ] + [{"name": MASTER_PORT_NAME, "containerPort": MASTER_PORT, "protocol": "TCP"}]  # fmt: skip
    return template


def worker_template(ctx: Context, spec: DisaggregatedInferenceSpec, role: str) -> dict[str, Any]:
    """GPU workers only: no API server, so no HTTP port and no HTTP probes; they live and die with the group."""
    template = copy.deepcopy(pod_template(ctx, spec, role))
    container = template["spec"]["containers"][0]
    engine_args = container["args"]
    container["command"] = ["python3", "-m", WORKER_MODULE, "serve"]
    container["args"] = engine_args + ["--headless"] + multinode_args(spec, role, f"$({WORKER_INDEX_ENV})")
    container["ports"] = _worker_ports(spec, role)
    if not container["ports"]:
        del container["ports"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        container.pop(probe, None)
    return template


def leaderworkerset(
    ctx: Context, spec: DisaggregatedInferenceSpec, role: str, name: str, replicas: int, group: Optional[int] = None
) -> dict[str, Any]:
    labels = naming.revision_labels(ctx.fleet, role, ctx.revision)
    if group is not None:
        labels = {**labels, naming.GROUP_LABEL: str(group)}
    return {
        "apiVersion": LWS_API,
        "kind": LWS_KIND,
        "metadata": metadata(ctx, name, labels),
        "spec": {
            "replicas": replicas,
            # Leader and workers are created together, so a gang scheduler sees the whole group.
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": spec.role(role).nodes_per_replica,
                # A TP group that lost a rank is useless: restart the whole group.
                "restartPolicy": "RecreateGroupOnPodRestart",
                "leaderTemplate": leader_template(ctx, spec, role),
                "workerTemplate": worker_template(ctx, spec, role),
            },
            "networkConfig": {"subdomainPolicy": "Shared"},
        },
    }


def group_name(ctx: Context, role: str, group: int) -> str:
    """A per-replica LeaderWorkerSet (under a gang provider), its PodGroup and gang name."""
    return f"{naming.role_workload_name(ctx.fleet, role, ctx.revision)}-{group}"
