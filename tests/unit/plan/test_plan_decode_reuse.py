"""spec.kvTransfer.decodeReuse (issue 40 part 3) in the plan: on, both roles run pdfleet's connector as kv_both
(also under kvOffload's MultiConnector) and the router gets the threshold; off (the default), every engine's
args and the router's are what they were before the field existed (negative control)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from pdfleet.contract.connector_config import KV_BOTH, KV_ROLES
from pdfleet.contract.router_config import DECODE_REUSE_OFF
from pdfleet.operator.api import parse
from pdfleet.operator.plan import context
from pdfleet.operator.plan.engine import vllm_args
from pdfleet.operator.plan.router import router_config

ROOT = Path(__file__).resolve().parents[3]


def cr(reuse: dict[str, Any] | None = None, offload: bool = False) -> dict[str, Any]:
    out = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    if reuse is not None:
        out["spec"].setdefault("kvTransfer", {})["decodeReuse"] = copy.deepcopy(reuse)
    if offload:
        out["spec"]["kvOffload"] = {"cpu": {"capacity": "1Gi"}}
    return out


def kv_config(resource: dict[str, Any], role: str) -> dict[str, Any]:
    args = vllm_args(parse(resource).spec, role, "r1")
    return json.loads(args[args.index("--kv-transfer-config") + 1])


def pdfleet_child(config: dict[str, Any]) -> dict[str, Any]:
    if config["kv_connector"] == "MultiConnector":
        return config["kv_connector_extra_config"]["connectors"][0]
    return config


@pytest.mark.parametrize("offload", [False, True])
def test_on_both_roles_hold_and_pull(offload):
    resource = cr({"enabled": True, "minReusableTokens": 96}, offload=offload)
    for role in ("prefill", "decode"):
        assert pdfleet_child(kv_config(resource, role))["kv_role"] == KV_BOTH
    parsed = parse(resource)
    assert router_config(context(parsed), parsed.spec).decode_reuse_min_tokens == 96


@pytest.mark.parametrize("reuse", [None, {"enabled": False, "minReusableTokens": 96}])
def test_off_changes_nothing(reuse):
    resource, plain = cr(reuse), cr()
    for role in ("prefill", "decode"):
        assert kv_config(resource, role)["kv_role"] == KV_ROLES[role]
        assert vllm_args(parse(resource).spec, role, "r1") == vllm_args(parse(plain).spec, role, "r1")
    parsed = parse(resource)
    cfg = router_config(context(parsed), parsed.spec)
    assert cfg.decode_reuse_min_tokens == DECODE_REUSE_OFF and not cfg.decode_reuse
    assert "--decode-reuse-min-tokens" not in cfg.to_argv()


@pytest.mark.parametrize("bad, field", [
    ({"enabled": True, "minReusableTokens": -1}, "minReusableTokens"),
    ({"enabled": True, "minReusableTokens": 10**7}, "minReusableTokens"),
    ({"enabled": "yes"}, "enabled"),
    ({"enabled": True, "ttl": 480}, "ttl"),
])
def test_bad_values_are_refused_naming_the_field(bad, field):
    with pytest.raises(Exception) as err:
        parse(cr(bad))
    assert field in str(err.value)
