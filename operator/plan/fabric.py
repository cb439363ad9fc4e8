"""The fabric preflight in a pod: an init container before the engine (pure).

`python3 -m pdfleet.connector.fabric` checks that UCX sees the transports the spec
asks for and that a loopback NIXL READ of a few MiB over them reaches
network.preflight.minGBps. Its verdict (JSON) goes to the termination message, where
the operator reads it from the pod status (KVTransport condition), and to a file in a
shared emptyDir, where the engine's connector reads the transport it runs on. The init
container always exits 0: a fleet on the wrong fabric still starts, and shows Degraded.
"""

from __future__ import annotations

from typing import Any

from pdfleet.contract import fabric as fabric_contract
from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan.engine import engine_env

CONTAINER_NAME = fabric_contract.CONTAINER_NAME
MODULE = "pdfleet.connector.fabric"
RUN_DIR = "/run/pdfleet"
RESULT_FILE = f"{RUN_DIR}/kv-transport.json"
RESULT_ENV = fabric_contract.RESULT_ENV
VOLUME = "pdfleet-run"
PROBE_MIB = 8
# UCX_TLS entries that mean RDMA verbs (InfiniBand / RoCE).
RDMA_TRANSPORTS = frozenset({"rc", "rc_v", "rc_x", "rc_verbs", "rc_mlx5", "ud", "ud_v", "ud_x", "ud_verbs",
                             "ud_mlx5", "dc", "dc_x", "dc_mlx5", "ib"})  # fmt: skip


def wants_rdma(spec: DisaggregatedInferenceSpec) -> bool:
    """The spec asked for an RDMA fabric: RDMA devices or resources, or an RDMA UCX transport."""
    rdma = spec.network.rdma
    if rdma is not None and (rdma.resource_name or rdma.devices):
        return True
    return any(t.lstrip("^") in RDMA_TRANSPORTS and not t.startswith("^") for t in spec.network.ucx_transports)


def probe_args(spec: DisaggregatedInferenceSpec) -> list[str]:
    return [
        "--want", "rdma" if wants_rdma(spec) else "any",
        "--min-gbps", f"{spec.network.preflight.min_g_bps:g}",
        "--mib", str(PROBE_MIB),
        "--result", RESULT_FILE,
    ]  # fmt: skip


def ucx_env(spec: DisaggregatedInferenceSpec, role: str) -> list[dict[str, str]]:
    """The engine's UCX settings: the probe must see the fabric exactly as the engine will."""
    return [{"name": k, "value": v} for k, v in engine_env(spec, role).items() if k.startswith("UCX_")]


def apply(pod_spec: dict[str, Any], spec: DisaggregatedInferenceSpec, role: str) -> None:
    """Add the preflight init container and the shared result file to a rendered pod spec (in place)."""
    if not spec.network.preflight.enabled:
        return
    engine = pod_spec["containers"][0]
    mount = {"name": VOLUME, "mountPath": RUN_DIR}
    init: dict[str, Any] = {
        "name": CONTAINER_NAME,
        "image": engine["image"],
        "imagePullPolicy": engine.get("imagePullPolicy", "IfNotPresent"),
        "command": ["python3", "-m", MODULE],
        "args": probe_args(spec),
        "env": ucx_env(spec, role),
        "volumeMounts": [m for m in engine.get("volumeMounts", []) if m["name"] == "dshm"] + [mount],
        # The verdict is the termination message; the kubelet copies it into the pod status.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if not init["env"]:
        del init["env"]
    for key in ("resources", "securityContext"):  # the same GPUs, RDMA devices and IPC_LOCK as the engine
        if key in engine:
            init[key] = engine[key]
    pod_spec["initContainers"] = [init, *pod_spec.get("initContainers", [])]
    pod_spec["volumes"] = [*pod_spec.get("volumes", []), {"name": VOLUME, "emptyDir": {"medium": "Memory"}}]
    engine["volumeMounts"] = [*engine.get("volumeMounts", []), {**mount, "readOnly": True}]
    engine["env"] = [*engine.get("env", []), {"name": RESULT_ENV, "value": RESULT_FILE}]
