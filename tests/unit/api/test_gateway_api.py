"""spec.gateway.inferencePool: defaults, and bad values refused with the field named, by pdfleet's
checks and by the CRD's own admission (schema and CEL) alike."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from crd_admission import admission_errors, assert_cel_agrees_with_python  # noqa: E402
from pdfleet.contract import gateway as gw  # noqa: E402
from pdfleet.operator.api import errors_of, parse  # noqa: E402
from pdfleet.operator.api.rules import GATEWAY_RULES  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


GW = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gw"}}}]


def cr(pool: Any = None, network_policy: bool = True) -> dict[str, Any]:
    out = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    if pool is not None:
        out["spec"]["gateway"] = {"inferencePool": copy.deepcopy(pool)}
    out["spec"].setdefault("network", {})["networkPolicy"] = network_policy
    return out


def test_defaults_are_off_fail_close_on_gaies_port() -> None:
    pool = parse(cr()).spec.gateway.inference_pool
    assert not pool.enabled
    assert (pool.failure_mode, pool.epp_port, pool.epp_replicas, pool.allow_from) == (gw.FAIL_CLOSE, 9002, 2, [])
    assert admission_errors(cr({"enabled": True, "allowFrom": GW})) == []


def test_the_gateways_peers_are_named_while_the_network_policy_is_on() -> None:
    """Enabling the pool never opens decode's engine port to every source unasked."""
    field = "spec.gateway.inferencePool.allowFrom"
    assert [e.field for e in errors_of(cr({"enabled": True}))] == [field]
    assert any("allowFrom" in r and "required" in r for r in admission_errors(cr({"enabled": True})))
    assert errors_of(cr({"enabled": True}, network_policy=False)) == []  # no policy, nothing to open
    assert admission_errors(cr({"enabled": True}, network_policy=False)) == []
    assert errors_of(cr({"enabled": False})) == []
    assert errors_of(cr({"enabled": True, "allowFrom": [{"namespaceSelector": {}}]})) == []  # every namespace, said so


GOOD = [
    {"enabled": True, "failureMode": "FailOpen", "failOpenWithoutEngineToken": True, "allowFrom": GW},
    {"enabled": True, "eppPort": 19002, "eppReplicas": 1, "allowFrom": GW},
    {"enabled": True, "allowFrom": [{"namespaceSelector": {"matchLabels": {"a": "b"}}, "podSelector": {}},
                                    {"ipBlock": {"cidr": "10.0.0.0/8"}}]},
]


@pytest.mark.parametrize("pool", GOOD)
def test_good_pools_are_admitted(pool) -> None:
    assert errors_of(cr(pool)) == []
    assert admission_errors(cr(pool)) == []


P = "spec.gateway.inferencePool"
BAD = [
    ("failure mode lower case", {"enabled": True, "failureMode": "failOpen", "allowFrom": GW}, f"{P}.failureMode"),
    ("enabled with no peers named", {"enabled": True}, f"{P}.allowFrom"),
    ("failure mode unknown", {"failureMode": "Retry"}, f"{P}.failureMode"),
    ("no replicas", {"enabled": True, "eppReplicas": 0, "allowFrom": GW}, f"{P}.eppReplicas"),
    ("port 0", {"eppPort": 0}, f"{P}.eppPort"),
    ("port above 65535", {"eppPort": 70000}, f"{P}.eppPort"),
    ("the picker's metrics port", {"enabled": True, "eppPort": gw.EPP_METRICS, "allowFrom": GW}, f"{P}.eppPort"),
    ("an empty peer", {"enabled": True, "allowFrom": [{}]}, f"{P}.allowFrom"),
    ("ipBlock beside a selector", {"allowFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]},
     f"{P}.allowFrom"),
    ("a peer with an unknown key", {"allowFrom": [{"serviceSelector": {}}]}, f"{P}.allowFrom[0].serviceSelector"),
    ("enabled as a string", {"enabled": "yes"}, f"{P}.enabled"),
    ("unknown key", {"enabled": True, "targetPort": 8000, "allowFrom": GW}, f"{P}.targetPort"),
]


@pytest.mark.parametrize("case,pool,field", BAD, ids=[b[0] for b in BAD])
def test_bad_pools_are_refused_with_the_field_named(case: str, pool: dict, field: str) -> None:
    errors = errors_of(cr(pool))
    assert [e for e in errors if e.field == field], f"{case}: {field} not named in {[str(e) for e in errors]}"
    refused = admission_errors(cr(pool))
    leaf = field.rsplit(".", 1)[-1].split("[")[0]
    assert any(field.removeprefix("spec.") in r or leaf in r for r in refused), f"{case}: the CRD admits it: {refused}"


def test_cel_and_python_agree_on_the_gateway_rules() -> None:
    peers = [{"podSelector": {}}, {"namespaceSelector": {"matchLabels": {"a": "b"}}},
             {"podSelector": {}, "namespaceSelector": {}}, {"ipBlock": {"cidr": "10.0.0.0/8"}}, {},
             {"ipBlock": {"cidr": "10.0.0.0/8"}, "namespaceSelector": {}}]
    grid = [(port, allow, enabled, policy, auth) for port in (None, 9002, gw.EPP_METRICS, 19002)
            for allow in (None, [], *([p] for p in peers), peers[:2], [peers[0], peers[4]])
            for enabled in (True, False) for policy in (True, False)
            for auth in (None, gw.CALLER_AUTH_NONE)]
    specs = []
    for port, allow, enabled, policy, auth in grid:
        pool: dict[str, Any] = {"enabled": enabled}
        if auth is not None:
            pool["callerAuth"] = auth
        if port is not None:
            pool["eppPort"] = port
        if allow is not None:
            pool["allowFrom"] = copy.deepcopy(allow)
        specs.append({"model": {"name": "m"}, "gateway": {"inferencePool": pool}, "network": {"networkPolicy": policy}})
    assert_cel_agrees_with_python(GATEWAY_RULES, specs)
