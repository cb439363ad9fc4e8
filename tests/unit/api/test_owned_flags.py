"""Every spelling vLLM accepts of a flag pdfleet sets is refused in extraArgs, with the field named
(pure; issue 20 row 8: OWNED_FLAGS matched exactly, so these got through)."""

from __future__ import annotations

import pytest

from pdfleet.operator.api import errors_of
from pdfleet.operator.api.rules import owned_flag, vllm_flag_name


@pytest.mark.parametrize("arg, flag", [
    ("--kv-transfer-config", "--kv-transfer-config"),
    ("--kv-transfer-config={}", "--kv-transfer-config"),
    ("--kv_transfer_config", "--kv-transfer-config"),  # underscores: vLLM turns them into dashes
    ("--kv_transfer_config={\"kv_role\":\"kv_both\"}", "--kv-transfer-config"),
    ("--kv-transfer-config.kv_role", "--kv-transfer-config"),  # a dotted JSON field
    ("--kv-transfer-config.kv_connector=NixlConnector", "--kv-transfer-config"),
    ("--kv-transfer-conf", "--kv-transfer-config"),  # argparse takes a unique prefix
    ("--config", "--config"), ("--config=flags.yaml", "--config"),  # a file of flags could set any
    ("-tp", "--tensor-parallel-size"), ("-tp=2", "--tensor-parallel-size"), ("-n", "--nnodes"), ("-r", "--node-rank"),
    ("--block_size", "--block-size"), ("--max_model_len=4096", "--max-model-len"),
    ("--kv-events-config.enable_kv_cache_events", "--kv-events-config"),
    ("--prefix_caching_hash_algo", "--prefix-caching-hash-algo"),
    # not owned
    ("--enable-prefix-caching", None), ("--gpu-memory-utilization=0.9", None), ("--config-format", None),
    ("--model-impl", None), ("-q", None), ("{\"kv_role\": 1}", None), ("4096", None), ("-1", None),
    ("--kv", None),  # too short to be read as an abbreviation here
])
def test_owned_flag(arg, flag):
    assert owned_flag(arg) == flag


@pytest.mark.parametrize("arg, name", [
    ("--a_b=1", "--a-b"), ("--a-b.c_d", "--a-b"), ("-tp", "-tp"), ("value", None), ("-5", None), ("--", None),
])
def test_vllm_flag_name(arg, name):
    assert vllm_flag_name(arg) == name


def resource(**engine):
    return {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "metadata": {"name": "f"},
            "spec": {"model": {"name": "m"}, "engine": engine, "decode": {"extraArgs": ["--kv_transfer_config", "{}"]}}}


def test_the_field_is_named():
    errors = {e.field: e.message for e in errors_of(resource(extraArgs=["--enable-prefix-caching", "--config=x.yaml"]))}
    assert set(errors) == {"spec.engine.extraArgs[1]", "spec.decode.extraArgs[0]"}
    assert "'--config' sets --config" in errors["spec.engine.extraArgs[1]"]
    assert "'--kv_transfer_config' sets --kv-transfer-config" in errors["spec.decode.extraArgs[0]"]
