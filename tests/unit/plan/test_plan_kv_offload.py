"""spec.kvOffload in the engines' args (issue 40 part 1): the roles it lists get vLLM's MultiConnector over
pdfleet's connector (first, asking for the offloading connector's KV layout) and the OffloadingConnector
(second: pdfleet's host-copy spec on CPU engines, vLLM's built-in CPU spec on GPU engines, the capacity in
bytes, self-describing events); KV events stay on. Negative control: without kvOffload, and for a role it
does not list, every engine's args are exactly what they were before the tier existed."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Optional

import pytest
import yaml

from pdfleet.connector.adapter.config import ConfigError, parse_adapter_config
from pdfleet.contract.kv_offload import (
    BUILTIN_CPU_SPEC, OFFLOADING_CONNECTOR, PDFLEET_CPU_SPEC, PDFLEET_CPU_SPEC_MODULE,
)
from pdfleet.operator.api import parse, quantity
from pdfleet.operator.plan import engine, offload, plan
from pdfleet.operator.plan.engine import vllm_args

ROOT = Path(__file__).resolve().parents[3]
ENV = {"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.7", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"}
EXAMPLES = ("tiny-cpu", "gpu-rdma", "hetero-tp")


def cr(example: str = "tiny-cpu", offload_block: Optional[dict[str, Any]] = None, **roles: Any) -> dict[str, Any]:
    out = yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())
    if offload_block is not None:
        out["spec"]["kvOffload"] = copy.deepcopy(offload_block)
    for role, resources in roles.items():
        out["spec"][role]["resources"] = resources
    return out


def kv_config(resource: dict[str, Any], role: str) -> dict[str, Any]:
    args = vllm_args(parse(resource).spec, role, "r1")
    return json.loads(args[args.index("--kv-transfer-config") + 1])


def pdfleet_only(resource: dict[str, Any], role: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The config the plan rendered before the tier existed: pdfleet's connector, no wrapping."""
    with monkeypatch.context() as m:
        m.setattr(offload, "with_offload", lambda spec, role, config: config)
        return kv_config(resource, role)


# The exact config of a tiny-cpu decode without the tier, as it was before issue 40.
TINY_DECODE_BEFORE = {
    "kv_buffer_device": "cpu", "kv_connector": "PdfleetConnector", "kv_connector_module_path": "pdfleet.connector",
    "kv_load_failure_policy": "recompute", "kv_role": "kv_consumer",
    "kv_connector_extra_config": {"auth_secret_file": "/var/run/secrets/pdfleet/side-channel-secret",
                                  "backends": ["UCX"], "compat_extra": "pdfleet-revision=r1", "lease_seconds": 30},
}


def test_without_the_tier_the_tiny_decode_renders_what_it_did_before() -> None:
    assert kv_config(cr(), "decode") == TINY_DECODE_BEFORE


@pytest.mark.parametrize("example", EXAMPLES)
def test_without_the_tier_nothing_changes_anywhere_in_the_plan(example: str, monkeypatch) -> None:
    with_module = plan(cr(example))
    with monkeypatch.context() as m:
        m.setattr(offload, "with_offload", lambda spec, role, config: config)
        before = plan(cr(example))
    assert with_module == before
    for role in ("prefill", "decode"):
        assert kv_config(cr(example), role)["kv_connector"] == "PdfleetConnector"


# (example, kvOffload, role resources override, role) -> (offloaded?, expected spec name, module path)
CASES = [
    ("tiny-cpu", {"cpu": {"capacity": "16Gi"}}, {}, "prefill", (True, PDFLEET_CPU_SPEC, PDFLEET_CPU_SPEC_MODULE)),
    ("tiny-cpu", {"cpu": {"capacity": "16Gi"}}, {}, "decode", (True, PDFLEET_CPU_SPEC, PDFLEET_CPU_SPEC_MODULE)),
    ("tiny-cpu", {"cpu": {"capacity": "1Gi"}, "roles": ["decode"]}, {}, "prefill", (False, None, None)),
    ("tiny-cpu", {"cpu": {"capacity": "1Gi"}, "roles": ["decode"]}, {}, "decode", (True, PDFLEET_CPU_SPEC,
                                                                                   PDFLEET_CPU_SPEC_MODULE)),
    ("tiny-cpu", {"cpu": {"capacity": "1Gi"}, "roles": ["prefill"]}, {}, "decode", (False, None, None)),
    ("gpu-rdma", {"cpu": {"capacity": "32Gi"}}, {}, "prefill", (True, BUILTIN_CPU_SPEC, None)),
    ("gpu-rdma", {"cpu": {"capacity": "32Gi"}}, {}, "decode", (True, BUILTIN_CPU_SPEC, None)),
    ("hetero-tp", {"cpu": {"capacity": "32Gi"}, "roles": ["decode"]}, {}, "decode", (True, BUILTIN_CPU_SPEC, None)),
    # a CPU prefill beside a GPU decode: each engine gets the spec that runs on it
    ("tiny-cpu", {"cpu": {"capacity": "2Gi"}}, {"decode": {"gpus": 1}}, "prefill", (True, PDFLEET_CPU_SPEC,
                                                                                   PDFLEET_CPU_SPEC_MODULE)),
    ("tiny-cpu", {"cpu": {"capacity": "2Gi"}}, {"decode": {"gpus": 1}}, "decode", (True, BUILTIN_CPU_SPEC, None)),
]


@pytest.mark.parametrize("example,block,resources,role,expected", CASES)
def test_the_listed_roles_get_the_tier_under_multiconnector(example, block, resources, role, expected,
                                                            monkeypatch) -> None:
    offloaded, spec_name, module = expected
    resource = cr(example, block, **resources)
    config, before = kv_config(resource, role), pdfleet_only(resource, role, monkeypatch)
    if not offloaded:
        assert config == before  # negative control: a role the tier does not list is untouched
        return
    assert config["kv_connector"] == "MultiConnector" and config["kv_role"] == "kv_both"
    assert config["kv_load_failure_policy"] == before["kv_load_failure_policy"]
    pdfleet, tier = config["kv_connector_extra_config"]["connectors"]
    # pdfleet's connector first, as before but for the KV layout the offloading connector asks for
    assert {**pdfleet, "kv_connector_extra_config": {k: v for k, v in pdfleet["kv_connector_extra_config"].items()
                                                      if k != "required_kv_cache_layout"}} == before
    assert pdfleet["kv_connector_extra_config"]["required_kv_cache_layout"] == "LBHNC"
    assert tier["kv_connector"] == OFFLOADING_CONNECTOR
    extra = tier["kv_connector_extra_config"]
    assert extra["spec_name"] == spec_name and extra.get("spec_module_path") == module
    assert extra["cpu_bytes_to_use"] == quantity.to_bytes(block["cpu"]["capacity"])
    assert extra["self_describing_kv_events"] is True and "block_size" not in extra


@pytest.mark.parametrize("capacity,expected", [("16Gi", 16 * 2**30), ("1.5Gi", 3 * 2**29), ("2e9", 2_000_000_000),
                                               ("100M", 100_000_000), ("1", 1)])
def test_the_capacity_reaches_the_engine_in_bytes(capacity: str, expected: int) -> None:
    tier = kv_config(cr(offload_block={"cpu": {"capacity": capacity}}), "decode")["kv_connector_extra_config"]
    assert tier["connectors"][1]["kv_connector_extra_config"]["cpu_bytes_to_use"] == expected


def test_an_offload_block_size_is_passed_and_events_stay_on() -> None:
    resource = cr(offload_block={"cpu": {"capacity": "1Gi"}, "blockSize": 128})
    args = vllm_args(parse(resource).spec, "prefill", "r1")
    tier = json.loads(args[args.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]["connectors"][1]
    assert tier["kv_connector_extra_config"]["block_size"] == 128
    assert json.loads(args[args.index("--kv-events-config") + 1])["enable_kv_cache_events"] is True
    assert "--enable-prefix-caching" in args


@pytest.mark.parametrize("role", ["prefill", "decode"])
def test_the_connector_accepts_its_part_and_the_configmap_matches_the_args(role: str, tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"s" * 32)
    resource = cr(offload_block={"cpu": {"capacity": "1Gi"}})
    args = vllm_args(parse(resource).spec, role, "r1", secret_file=str(secret))
    pdfleet = json.loads(args[args.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]["connectors"][0]
    assert parse_adapter_config(pdfleet["kv_connector_extra_config"], ENV).settings.required_kv_cache_layout == "LBHNC"
    with pytest.raises(ConfigError, match="required_kv_cache_layout"):  # negative control: another layout is refused
        parse_adapter_config({**pdfleet["kv_connector_extra_config"], "required_kv_cache_layout": "BHLNC"}, ENV)
    cm = next(o for o in plan(resource) if o["kind"] == "ConfigMap" and f"kv-transfer-{role}.json" in o["data"])
    rendered = json.loads(cm["data"][f"kv-transfer-{role}.json"])
    assert rendered["kv_connector"] == "MultiConnector" and rendered == engine.kv_transfer_config(
        parse(resource).spec, role, rendered["kv_connector_extra_config"]["connectors"][0]["kv_connector_extra_config"]
        ["compat_extra"].removeprefix("pdfleet-revision="))


@pytest.mark.parametrize("block,expected", [
    (None, None),
    ({"cpu": {"capacity": "16Gi"}}, {"capacity": "16Gi", "capacityBytes": 16 * 2**30, "roles": ["prefill", "decode"],
                                     "blockSize": 32}),
    ({"cpu": {"capacity": "1G"}, "roles": ["decode"], "blockSize": 96},
     {"capacity": "1G", "capacityBytes": 10**9, "roles": ["decode"], "blockSize": 96}),
])
def test_status_shows_the_tier(block, expected) -> None:
    assert offload.status(parse(cr(offload_block=block)).spec) == expected
