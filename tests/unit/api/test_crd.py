"""The CRD is generated from the models, structural, and its CEL agrees with the Python rules."""

from __future__ import annotations

import itertools
import random
from pathlib import Path
from typing import Any, Iterator

import kubernetes_validate
import pytest
import yaml

from pdfleet.operator.api import SPEC_RULES
from pdfleet.operator.api.crd import crd, crd_yaml
from pdfleet.operator.api.rules import CANARY_RULES, FLOW_CONTROL_RULES, SCALING_RULES, TOPOLOGY_RULES
from pdfleet.operator.api.rules import TEST_HOOK_RULES  # own grid: test_test_hook_rules.py
from pdfleet.operator.api.rules import DISAGGREGATION_RULES  # own grid: test_disaggregation_api.py
from pdfleet.operator.api.rules import PREFIX_SCORING_RULES  # own grid: test_prefix_scoring_api.py
from pdfleet.operator.api.rules import SCALE_TO_ZERO_RULES  # own grid: test_scale_to_zero_api.py
from pdfleet.operator.api.rules import GATEWAY_RULES  # own grid: test_gateway_api.py
from pdfleet.operator.api.rules import FAIL_OPEN_RULES  # own grid: test_gateway_fail_open_api.py
from pdfleet.operator.api.rules import KV_OFFLOAD_RULES  # own grid: test_kv_offload_api.py
from crd_admission import assert_cel_agrees_with_python, disagreements, root_schema  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
COMMITTED = ROOT / "crds" / "pdfleet.io_disaggregatedinferences.yaml"


def test_committed_crd_equals_generated() -> None:
    assert COMMITTED.read_text() == crd_yaml(), "crds/ drifted from the API models: run `make crds`"


@pytest.mark.parametrize("version", ["1.30.0", "1.33.0"])
def test_crd_is_a_valid_apiextensions_object(version: str) -> None:
    kubernetes_validate.validate(crd(), version, strict=True)


def _nodes(node: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    if isinstance(node, dict):
        yield path, node
        for key, value in node.get("properties", {}).items():
            yield from _nodes(value, f"{path}.{key}")
        if isinstance(node.get("items"), dict):
            yield from _nodes(node["items"], f"{path}[]")
        if isinstance(node.get("additionalProperties"), dict):
            yield from _nodes(node["additionalProperties"], f"{path}{{}}")


def test_schema_is_structural() -> None:
    for path, node in _nodes(root_schema()):
        for forbidden in ("$ref", "title", "$defs", "nullable", "const"):
            assert forbidden not in node, f"{path} has {forbidden}"
        assert node.get("additionalProperties") is not False, f"{path}: additionalProperties false"
        if "anyOf" in node or "oneOf" in node:
            pytest.fail(f"{path}: unions are not structural")
        if not node.get("x-kubernetes-int-or-string") and not node.get("x-kubernetes-preserve-unknown-fields"):
            assert "type" in node, f"{path} has no type"


def test_optional_objects_are_not_defaulted() -> None:
    spec = root_schema()["properties"]["spec"]["properties"]
    assert "default" not in spec["model"]["properties"]["source"]
    assert "default" not in spec["kvTransfer"]["properties"]["authSecretRef"]
    assert spec["prefill"]["default"] == {}


def test_status_subresource_columns_and_names() -> None:
    version = crd()["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns["Ready"] == '.status.conditions[?(@.type=="Ready")].status'
    assert {"Model", "Prefill-Ready", "Prefill", "Decode-Ready", "Decode", "Age"} <= set(columns)
    names = crd()["spec"]["names"]
    assert names["shortNames"] == ["dinf"] and names["plural"] == "disaggregatedinferences"
    conditions = root_schema()["properties"]["status"]["properties"]["conditions"]
    assert conditions["x-kubernetes-list-type"] == "map" and conditions["x-kubernetes-list-map-keys"] == ["type"]


# A grid of specs on which every rule is both satisfied and broken somewhere.
GRID = {
    "prefill_tp": [1, 2],
    "decode_tp": [1, 2, 3],
    "prefill_gpus": [None, 0],
    "decode_gpus": [None, 0, 1],
    "buffer": ["cuda", "cpu"],
    "side_port": [5600, 65535, 5556],  # 5556 + TP 2 reaches the KV event port 5557
    "engine_port": [8000, 5601, 5558],
    "block": [16, 32],
    "rdma": [None, {"resourceName": "rdma/ib", "count": 0}, {"count": 0}, {"resourceName": "rdma/ib"}],
    "source": [None, {"pvc": {"claimName": "m"}, "hf": {}}, {"hf": {}}],
}
SAMPLES = random.Random(7).sample(list(itertools.product(*GRID.values())), 200)
# The scaling rules (test_scaling_api.py) and the multi-node/gang/placement rules (test_topology_rules.py)
# have their own grids.
CEL_RULES = [r for r in SPEC_RULES if r.cel and r not in SCALING_RULES and r not in TOPOLOGY_RULES
             and r not in FLOW_CONTROL_RULES and r not in CANARY_RULES
             and r not in TEST_HOOK_RULES and r not in DISAGGREGATION_RULES]  # those have their own grids
CEL_RULES = [r for r in CEL_RULES if r not in GATEWAY_RULES and r not in FAIL_OPEN_RULES
             and r not in PREFIX_SCORING_RULES and r not in SCALE_TO_ZERO_RULES and r not in KV_OFFLOAD_RULES]


def _spec(prefill_tp, decode_tp, prefill_gpus, decode_gpus, buffer, side_port, engine_port, block, rdma, source):
    def role(tp: int, gpus: Any) -> dict[str, Any]:
        return {"tensorParallelSize": tp, **({"resources": {"gpus": gpus}} if gpus is not None else {})}

    spec: dict[str, Any] = {
        "model": {"name": "m", **({"source": source} if source else {})},
        "prefill": role(prefill_tp, prefill_gpus),
        "decode": role(decode_tp, decode_gpus),
        "kvTransfer": {"bufferDevice": buffer, "sideChannelPort": side_port},
        "engine": {"blockSize": block, "port": engine_port},
    }
    if rdma:
        spec["network"] = {"rdma": rdma}
    return spec


def test_cel_rules_agree_with_python_rules() -> None:
    assert_cel_agrees_with_python(CEL_RULES, [_spec(*values) for values in SAMPLES])


def test_cel_comparison_can_fail() -> None:
    """Negative control: a deliberately wrong CEL rule disagrees with Python somewhere."""
    wrong = "self.decode.tensorParallelSize >= self.prefill.tensorParallelSize"
    assert disagreements(wrong, CEL_RULES[0], [_spec(*values) for values in SAMPLES[:60]]) > 0


def test_crd_yaml_round_trips() -> None:
    assert yaml.safe_load(crd_yaml()) == crd()
