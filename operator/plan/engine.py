"""The vLLM engine a prefill or decode pod runs, built from the spec (pure).

`pdfleet local` starts the same command with local host and ports, so what the
pods run and what the demo runs cannot drift.
"""

from __future__ import annotations

import json
from typing import Any, Optional

from pdfleet.operator.api.types import DisaggregatedInferenceSpec

ENGINE_MODULE = "vllm.entrypoints.openai.api_server"
CONNECTOR_MODULE = "pdfleet.connector"
CONNECTOR_CLASS = "PdfleetConnector"
KV_ROLES = {"prefill": "kv_producer", "decode": "kv_consumer"}
SECRET_DIR = "/var/run/secrets/pdfleet"
SECRET_FILE = "side-channel-secret"


def kv_transfer_config(
    spec: DisaggregatedInferenceSpec, role: str, revision: str, secret_file: Optional[str] = None
) -> dict[str, Any]:
    """vLLM's --kv-transfer-config for one role."""
    kv = spec.kv_transfer
    extra: dict[str, Any] = {
        "backends": list(kv.backends),
        "lease_seconds": kv.lease_seconds,
        # Mixed into the connector's compatibility hash: engines of two revisions
        # refuse each other's handshake, even if something routes across a rollout.
        "compat_extra": f"pdfleet-revision={revision}",
    }
    if secret_file:
        extra["auth_secret_file"] = secret_file
    elif kv.auth_secret_ref is not None:
        extra["auth_secret_file"] = f"{SECRET_DIR}/{SECRET_FILE}"
    return {
        "kv_connector": CONNECTOR_CLASS,
        "kv_connector_module_path": CONNECTOR_MODULE,
        "kv_role": KV_ROLES[role],
        "kv_buffer_device": kv.buffer_device,
        "kv_load_failure_policy": kv.load_failure_policy,
        "kv_connector_extra_config": extra,
    }


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
) -> list[str]:
    """Arguments after `python -m vllm.entrypoints.openai.api_server`.

    `model`, `host`, `port` and `secret_file` let `pdfleet local` substitute a
    generated model, loopback and free ports; pods use the spec's values.
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
    if spec.model.dtype != "auto":
        args += ["--dtype", spec.model.dtype]
    if spec.model.max_model_len:
        args += ["--max-model-len", str(spec.model.max_model_len)]
    if spec.model.source and spec.model.source.hf and spec.model.source.hf.revision:
        args += ["--revision", spec.model.source.hf.revision]
    config = kv_transfer_config(spec, role, revision, secret_file)
    args += ["--kv-transfer-config", json.dumps(config, sort_keys=True, separators=(",", ":"))]
    return args + list(spec.engine.extra_args) + list(r.extra_args)


def engine_env(spec: DisaggregatedInferenceSpec, role: str) -> dict[str, str]:
    """Plain environment of an engine. The side-channel host is not here: pods
    take it from the downward API (status.podIP), local runs use loopback."""
    env = {"VLLM_NIXL_SIDE_CHANNEL_PORT": str(spec.kv_transfer.side_channel_port)}
    net = spec.network
    if net.rdma and net.rdma.devices:
        env["UCX_NET_DEVICES"] = ",".join(net.rdma.devices)
    if net.ucx_transports:
        env["UCX_TLS"] = ",".join(net.ucx_transports)
    for var in [*spec.engine.env, *spec.role(role).env]:
        env[var.name] = var.value
    return env
