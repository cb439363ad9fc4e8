"""The vLLM engine a prefill or decode pod runs, built from the spec (pure).

`pdfleet local` starts the same command with local host and ports, so what the
pods run and what the demo runs cannot drift.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from pdfleet.contract import env as env_names
from pdfleet.contract import ports
from pdfleet.contract.connector_config import (
    CONNECTOR_CLASS, CONNECTOR_MODULE, KV_BOTH, KV_ROLES, ConnectorExtraConfig, nixl_threads_for,
)
from pdfleet.contract.routing import DEFAULT_HASH_SEED, PREFIX_HASH_ALGO
from pdfleet.operator.api.rules import UCX_TCP_PORT_RANGE_VAR, parse_port_range  # noqa: F401
from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan import drain, offload

ENGINE_MODULE = "vllm.entrypoints.openai.api_server"
SECRET_DIR = "/var/run/secrets/pdfleet"
SECRET_FILE = "side-channel-secret"
# KV cache events (the router's prefix index): a ZMQ PUB port and its replay port on every engine.
KV_EVENTS_PORT = ports.KV_EVENTS
KV_EVENTS_REPLAY_PORT = ports.KV_EVENTS_REPLAY


def kv_events_config(endpoint: str, replay: Optional[str]) -> dict[str, Any]:
    """vLLM's --kv-events-config: publish block stored/removed/cleared events over ZMQ."""
    config: dict[str, Any] = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": endpoint}
    if replay:
        config["replay_endpoint"] = replay
    return config


def hash_seed(spec: DisaggregatedInferenceSpec) -> str:
    """The seed the engines' block hashes start from (the router must use the same)."""
    seed = DEFAULT_HASH_SEED
    for var in [*spec.engine.env, *spec.prefill.env, *spec.decode.env]:
        if var.name == env_names.HASH_SEED:
            seed = var.value
    return seed


def kv_transfer_config(
    spec: DisaggregatedInferenceSpec, role: str, revision: str, secret_file: Optional[str] = None
) -> dict[str, Any]:
    """vLLM's --kv-transfer-config for one role."""
    kv = spec.kv_transfer
    extra = ConnectorExtraConfig(
        backends=tuple(kv.backends),
        lease_seconds=kv.lease_seconds,
        # Mixed into the connector's compatibility hash: engines of two revisions
        # refuse each other's handshake, even if something routes across a rollout.
        compat_extra=f"pdfleet-revision={revision}",
        # Always signed: the user's Secret (authSecretRef) or the fleet's generated one is mounted there.
        auth_secret_file=secret_file or f"{SECRET_DIR}/{SECRET_FILE}",
        nixl_threads=nixl_threads_for(kv.buffer_device, kv.nixl_threads),
    ).to_extra()
    return offload.with_offload(spec, role, {
        "kv_connector": CONNECTOR_CLASS,
        "kv_connector_module_path": CONNECTOR_MODULE,
        # decodeReuse: decode also holds (for the next turn), prefill also pulls (from the last turn's decode)
        "kv_role": KV_BOTH if kv.decode_reuse.enabled else KV_ROLES[role],
        "kv_buffer_device": kv.buffer_device,
        "kv_load_failure_policy": kv.load_failure_policy,
        "kv_connector_extra_config": extra,
    })  # spec.kvOffload: under vLLM's MultiConnector beside the offload tier (plan/offload.py)


def model_path(spec: DisaggregatedInferenceSpec) -> str:
    return spec.model.name


def served_model_name(spec: DisaggregatedInferenceSpec) -> str:
    return spec.model.served_model_name or spec.model.name


def vllm_args(
    spec: DisaggregatedInferenceSpec,
    role: str,
    revision: str,
    *,
    model: Optional[str] = None,
    host: Optional[str] = None,
    port: Optional[int] = None,
    secret_file: Optional[str] = None,
    kv_events: Optional[tuple[str, Optional[str]]] = None,
) -> list[str]:
    """Arguments after `python -m vllm.entrypoints.openai.api_server`.

    `model`, `host`, `port`, `secret_file` and `kv_events` (PUB, replay) let
    `pdfleet local` substitute a generated model, loopback, free ports and local
    sockets; pods use the spec's values (KV events bound on the pod's ports).
    """
    r = spec.role(role)
    args = [
        "--model", model or model_path(spec),
        "--served-model-name", served_model_name(spec),
        "--port", str(port or spec.engine.port),
        "--tensor-parallel-size", str(r.tensor_parallel_size),
        "--block-size", str(spec.engine.block_size),
    ]  # fmt: skip
    if host:
        args += ["--host", host]
    # Drain, not drop, on SIGTERM (vLLM's default 0 aborts in-flight requests): see drain.py.
    args += ["--shutdown-timeout", str(drain.shutdown_timeout(spec, role))]
    if spec.model.dtype != "auto":
        args += ["--dtype", spec.model.dtype]
    if spec.model.max_model_len:
        args += ["--max-model-len", str(spec.model.max_model_len)]
    if spec.model.source and spec.model.source.hf and spec.model.source.hf.revision:
        args += ["--revision", spec.model.source.hf.revision]
    config = kv_transfer_config(spec, role, revision, secret_file)
    args += ["--kv-transfer-config", json.dumps(config, sort_keys=True, separators=(",", ":"))]
    events = kv_events or (f"tcp://*:{KV_EVENTS_PORT}", f"tcp://*:{KV_EVENTS_REPLAY_PORT}")
    args += [
        "--enable-prefix-caching", "--prefix-caching-hash-algo", PREFIX_HASH_ALGO,
        "--kv-events-config", json.dumps(kv_events_config(*events), sort_keys=True, separators=(",", ":")),
    ]  # fmt: skip
    return args + list(spec.engine.extra_args) + list(r.extra_args)


# UCX's TCP transport (KV data, and wireup where no RDMA is present) listens on one port per
# interface and worker, picked by the kernel unless pinned: pinned here so that the
# NetworkPolicy can open them (plan/policy.py). 128 ports: TP ranks x interfaces x workers.
UCX_TCP_PORT_RANGE = (20000, 20127)

# UCX reads GPU memory of another process on the same host over TCP unless cuda_ipc GET
# is enabled (it is off without NVLink): 0.4 vs 245 GB/s on an H100 (docs/connector.md).
UCX_CUDA_IPC_GET_ZCOPY = "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"


def engine_env(spec: DisaggregatedInferenceSpec, role: str) -> dict[str, str]:
    """Plain environment of an engine. The side-channel host is not here: pods
    take it from the downward API (status.podIP), local runs use loopback.
    A variable the user sets in the spec's env always wins, except a test-only hook
    (PDFLEET_TEST_*): validation refuses it, and the plan never renders one either."""
    env = {env_names.SIDE_CHANNEL_PORT: str(spec.kv_transfer.side_channel_port),
           UCX_TCP_PORT_RANGE_VAR: "{}-{}".format(*UCX_TCP_PORT_RANGE)}
    net = spec.network
    if net.rdma and net.rdma.devices:
        env["UCX_NET_DEVICES"] = ",".join(net.rdma.devices)
    if net.ucx_transports:
        env["UCX_TLS"] = ",".join(net.ucx_transports)
    if spec.kv_transfer.buffer_device == "cuda":  # CPU-only UCX would warn about an unused variable
        env[UCX_CUDA_IPC_GET_ZCOPY] = "y"
    for var in [*spec.engine.env, *spec.role(role).env]:
        if not var.name.startswith(env_names.TEST_PREFIX) and var.name != env_names.VLLM_API_KEY:
            env[var.name] = var.value  # the API token comes from the fleet's Secret only (plan/auth.py)
    return env

