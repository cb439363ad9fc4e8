"""Prefill and decode: StatefulSet, pod template, headless Service, ConfigMap (pure)."""

from __future__ import annotations

import json
from typing import Any

from pdfleet.contract import env as env_names
from pdfleet.contract import ports
from pdfleet.operator.api.rules import gpus
from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan import drain, naming
from pdfleet.operator.plan.auth import auth_secret, engine_api_token_env
from pdfleet.operator.plan.model_files import hf_cache, hf_token_env, model_volume
from pdfleet.operator.plan.engine import (
    ENGINE_MODULE,
    KV_EVENTS_PORT,
    KV_EVENTS_REPLAY_PORT,
    SECRET_DIR,
    SECRET_FILE,
    engine_env,
    kv_transfer_config,
    vllm_args,
)
from pdfleet.operator.plan.meta import Context, metadata

HTTP_PORT_NAME = ports.HTTP_NAME
SIDE_CHANNEL_PORT_NAME = ports.SIDE_CHANNEL_NAME
KV_EVENTS_PORT_NAME = ports.KV_EVENTS_NAME  # the router's discovery reads these names
KV_EVENTS_REPLAY_PORT_NAME = ports.KV_EVENTS_REPLAY_NAME
KV_EVENTS_PORTS = ((KV_EVENTS_PORT_NAME, KV_EVENTS_PORT), (KV_EVENTS_REPLAY_PORT_NAME, KV_EVENTS_REPLAY_PORT))
KV_CONFIG_DIR = "/etc/pdfleet"
MULTUS_ANNOTATION = "k8s.v1.cni.cncf.io/networks"
# Model loading (download, weights to GPU, CUDA graphs) may take many minutes.
STARTUP_BUDGET_SECONDS = 1800
STARTUP_PERIOD_SECONDS = 10


def side_channel_ports(spec: DisaggregatedInferenceSpec, role: str) -> list[tuple[str, int]]:
    """One handshake port per TP rank of this role: base, base+1, ..."""
    base = spec.kv_transfer.side_channel_port
    tp = spec.role(role).tensor_parallel_size
    return [(SIDE_CHANNEL_PORT_NAME if r == 0 else f"{SIDE_CHANNEL_PORT_NAME}-{r}", base + r) for r in range(tp)]


def _env(fleet: str, spec: DisaggregatedInferenceSpec, role: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        # The side channel must be reachable by other pods and must not be
        # 0.0.0.0 or localhost, which make decode dial itself.
        {"name": env_names.SIDE_CHANNEL_HOST, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    ]
    source = spec.model.source
    if source and source.hf:
        env += hf_cache()[0] + hf_token_env(spec)
    env += [{"name": k, "value": v} for k, v in engine_env(spec, role).items()]
    env.append(engine_api_token_env(fleet))  # last: a spec env var of that name cannot replace the Secret's
    return env


def _resources(spec: DisaggregatedInferenceSpec, role: str) -> dict[str, Any]:
    r = spec.role(role).resources
    limits: dict[str, Any] = {}
    requests: dict[str, Any] = {}
    if gpus(spec.role(role)):
        limits["nvidia.com/gpu"] = gpus(spec.role(role))
    rdma = spec.network.rdma
    if rdma and rdma.resource_name:
        limits[rdma.resource_name] = rdma.count
    for name, value in (("cpu", r.cpu), ("memory", r.memory)):
        if value:
            requests[name] = value
            limits[name] = value
    out: dict[str, Any] = {}
    if limits:
        out["limits"] = limits
    if requests:
        out["requests"] = requests
    return out


def _volumes(ctx: Context, spec: DisaggregatedInferenceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    volumes: list[dict[str, Any]] = [
        # NCCL and UCX use shared memory; the container default of 64 MiB is far too small.
        {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        {"name": "kv-config", "configMap": {"name": naming.kv_config_name(ctx.fleet, ctx.revision)}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "dshm", "mountPath": "/dev/shm"},
        {"name": "kv-config", "mountPath": KV_CONFIG_DIR, "readOnly": True},
    ]
    source = spec.model.source
    model_volumes, model_mounts = model_volume(spec)
    volumes += model_volumes
    mounts += model_mounts
    if source and source.hf:
        _, cache_volume, cache_mount = hf_cache()
        volumes.append(cache_volume)
        mounts.append(cache_mount)
    # Always mounted (secure by default): the user's Secret or the fleet's generated one.
    secret_name, secret_key = auth_secret(ctx.fleet, spec)
    volumes.append(
        {
            "name": "side-channel-secret",
            "secret": {"secretName": secret_name, "items": [{"key": secret_key, "path": SECRET_FILE}],
                       "defaultMode": 0o400},
        }
    )
    mounts.append({"name": "side-channel-secret", "mountPath": SECRET_DIR, "readOnly": True})
    return volumes, mounts


def _probes(port_name: str) -> dict[str, Any]:
    def probe(period: int, failures: int) -> dict[str, Any]:
        return {
            "httpGet": {"path": "/health", "port": port_name},
            "periodSeconds": period,
            "failureThreshold": failures,
            "timeoutSeconds": 5,
        }

    return {
        "startupProbe": probe(STARTUP_PERIOD_SECONDS, STARTUP_BUDGET_SECONDS // STARTUP_PERIOD_SECONDS),
        "readinessProbe": probe(5, 3),
        "livenessProbe": probe(10, 6),
    }


def _termination_grace(spec: DisaggregatedInferenceSpec, role: str) -> int:
    # A terminating prefill still serves reads of blocks it leased to decodes (see drain.py).
    return drain.termination_grace(spec, role)


def engine_security_context(rdma: bool) -> dict[str, Any]:
    """As close to Pod Security "restricted" as the engines allow. Not set, and why:
    runAsNonRoot (the vLLM image runs as root, and with RDMA the pinned-memory limit needs
    IPC_LOCK in the effective set, which a non-root process does not get from the pod spec);
    readOnlyRootFilesystem (vLLM, torch and triton write caches under the home directory and /tmp).
    IPC_LOCK is added only for RDMA: registering memory with the NIC pins pages."""
    caps: dict[str, Any] = {"drop": ["ALL"]}
    if rdma:
        caps["add"] = ["IPC_LOCK"]
    return {"allowPrivilegeEscalation": False, "capabilities": caps, "seccompProfile": {"type": "RuntimeDefault"}}


def pod_template(ctx: Context, spec: DisaggregatedInferenceSpec, role: str) -> dict[str, Any]:
    r = spec.role(role)
    volumes, mounts = _volumes(ctx, spec)
    ports = [{"name": HTTP_PORT_NAME, "containerPort": spec.engine.port, "protocol": "TCP"}]
    ports += [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in side_channel_ports(spec, role)]
    ports += [{"name": n, "containerPort": p, "protocol": "TCP"} for n, p in KV_EVENTS_PORTS]
    container: dict[str, Any] = {
        "name": "vllm",
        "image": ctx.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["python3", "-m", ENGINE_MODULE],
        "args": vllm_args(spec, role, ctx.revision),
        "env": _env(ctx.fleet, spec, role),
        "ports": ports,
        "volumeMounts": mounts,
        **_probes(HTTP_PORT_NAME),
    }
    resources = _resources(spec, role)
    if resources:
        container["resources"] = resources
    rdma = spec.network.rdma
    container["securityContext"] = engine_security_context(bool(rdma and rdma.resource_name))

    annotations = dict(r.pod_annotations)
    if rdma and rdma.multus_networks:
        annotations[MULTUS_ANNOTATION] = ",".join(rdma.multus_networks)
    labels = {**r.pod_labels, **naming.revision_labels(ctx.fleet, role, ctx.revision)}
    pod: dict[str, Any] = {
        # Service links would inject e.g. VLLM_ROUTER_PORT, which vLLM reads as its own settings.
        "enableServiceLinks": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "terminationGracePeriodSeconds": _termination_grace(spec, role),
        "containers": [container],
        "volumes": volumes,
    }
    if spec.network.host_network:
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"
    if r.node_selector:
        pod["nodeSelector"] = dict(r.node_selector)
    if r.tolerations:
        pod["tolerations"] = [t.model_dump(by_alias=True, exclude_none=True) for t in r.tolerations]
    if r.affinity:
        pod["affinity"] = r.affinity
    if spec.image_pull_secrets:
        pod["imagePullSecrets"] = [{"name": s.name} for s in spec.image_pull_secrets]
    template_meta: dict[str, Any] = {"labels": labels}
    if annotations:
        template_meta["annotations"] = annotations
    return {"metadata": template_meta, "spec": pod}


def statefulset(ctx: Context, spec: DisaggregatedInferenceSpec, role: str) -> dict[str, Any]:
    name = naming.role_workload_name(ctx.fleet, role, ctx.revision)
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": metadata(ctx, name, naming.revision_labels(ctx.fleet, role, ctx.revision)),
        "spec": {
            "serviceName": name,
            "replicas": spec.role(role).replicas,
            # Engines are independent: start them all at once, not one by one.
            "podManagementPolicy": "Parallel",
            "selector": {"matchLabels": naming.selector(ctx.fleet, role, ctx.revision)},
            "updateStrategy": {"type": "RollingUpdate"},
            "template": pod_template(ctx, spec, role),
        },
    }


def headless_service(ctx: Context, spec: DisaggregatedInferenceSpec, role: str) -> dict[str, Any]:
    """Per-pod DNS and EndpointSlices: handshakes must reach one engine, never a load-balanced VIP."""
    name = naming.role_workload_name(ctx.fleet, role, ctx.revision)
    ports = [{"name": HTTP_PORT_NAME, "port": spec.engine.port, "targetPort": HTTP_PORT_NAME, "protocol": "TCP"}]
    ports += [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in side_channel_ports(spec, role)]
    ports += [{"name": n, "port": p, "targetPort": n, "protocol": "TCP"} for n, p in KV_EVENTS_PORTS]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(ctx, name, naming.revision_labels(ctx.fleet, role, ctx.revision)),
        "spec": {
            "clusterIP": "None",
            # Peers resolve a starting pod before it is Ready; the router reads `serving`.
            "publishNotReadyAddresses": True,
            "selector": naming.selector(ctx.fleet, role, ctx.revision),
            "ports": ports,
        },
    }


def kv_config_map(ctx: Context, spec: DisaggregatedInferenceSpec) -> dict[str, Any]:
    data = {
        f"kv-transfer-{role}.json": json.dumps(kv_transfer_config(spec, role, ctx.revision), indent=2, sort_keys=True)
        for role in ("prefill", "decode")
    }
    labels = naming.revision_only_labels(ctx.fleet, ctx.revision)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata(ctx, naming.kv_config_name(ctx.fleet, ctx.revision), labels),
        "data": data,
    }
