"""pdfleet enables UCX's cuda_ipc GET for GPU-buffer fleets unless the user set it
(pods through the plan, `pdfleet local` through the same env builder)."""

from __future__ import annotations

import pytest

from pdfleet.operator.api import parse
from pdfleet.operator.local.fleet import EnginePorts, plan_local
from pdfleet.operator.plan.engine import UCX_CUDA_IPC_GET_ZCOPY, engine_env

VAR = "UCX_CUDA_IPC_ENABLE_GET_ZCOPY"


def spec(buffer: str, engine_env_vars=(), decode_env_vars=()):
    return parse({"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "metadata": {"name": "t"},
                  "spec": {"model": {"name": "m"}, "engine": {"blockSize": 32, "env": list(engine_env_vars)},
                           "prefill": {"replicas": 1}, "decode": {"replicas": 1, "env": list(decode_env_vars)},
                           "kvTransfer": {"bufferDevice": buffer}}}).spec


@pytest.mark.parametrize(
    "buffer, engine_vars, decode_vars, prefill_value, decode_value",
    [
        ("cuda", [], [], "y", "y"),  # GPU KV: cuda_ipc reads on, else UCX reads over TCP
        ("cpu", [], [], None, None),  # DRAM KV: not set (CPU-only UCX warns about unused variables)
        ("cuda", [{"name": VAR, "value": "n"}], [], "n", "n"),  # the user's engine env wins
        ("cuda", [], [{"name": VAR, "value": "n"}], "y", "n"),  # ... and a role's env
        ("cpu", [{"name": VAR, "value": "y"}], [], "y", "y"),
    ],
)
def test_engine_env_sets_cuda_ipc_get_unless_the_user_did(buffer, engine_vars, decode_vars, prefill_value,
                                                          decode_value):
    s = spec(buffer, engine_vars, decode_vars)
    assert UCX_CUDA_IPC_GET_ZCOPY == VAR
    assert engine_env(s, "prefill").get(VAR) == prefill_value
    assert engine_env(s, "decode").get(VAR) == decode_value


def _local_env(s, base_env):
    ports = {"prefill": [EnginePorts(9000, 9100)], "decode": [EnginePorts(9001, 9101)]}
    plan = plan_local(s, revision="r", model_path=None, cpus=[0, 1], ports=ports, base_env=base_env)
    return plan.engines[0].env


def test_pdfleet_local_uses_the_same_env_and_leaves_the_runners_value_alone():
    assert _local_env(spec("cuda"), {})[VAR] == "y"
    assert VAR not in _local_env(spec("cuda"), {VAR: "n"})  # inherited from the runner's shell
    assert _local_env(spec("cuda", [{"name": VAR, "value": "y"}]), {VAR: "n"})[VAR] == "y"  # the spec wins
