"""What `kubectl explain` and the API server say about a fleet: every spec property described, and each rule in
the same words as `pdfleet validate`."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Iterator

import yaml

from crd_admission import root_schema  # noqa: E402
from pdfleet.operator.api import SPEC_RULES, cidr, errors_of, scaler  # noqa: E402, F401
from pdfleet.operator.api.types import NAME_MESSAGE  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def undescribed(node: dict[str, Any], path: str) -> Iterator[str]:
    """Every property below node without a description, by its dotted path."""
    for name, sub in node.get("properties", {}).items():
        if not sub.get("description"):
            yield f"{path}.{name}"
        yield from undescribed(sub, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from undescribed(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from undescribed(node["additionalProperties"], f"{path}{{}}")


def _spec(crd_text: str) -> dict[str, Any]:
    return yaml.safe_load(crd_text)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


CRD_FILES = ["pdfleet.io_disaggregatedinferences.yaml", "pdfleet.io_disaggregatedinferencescalers.yaml"]


def test_every_spec_property_has_a_description() -> None:
    for name in CRD_FILES:
        for folder in ("crds", "charts/pdfleet/crds"):
            assert list(undescribed(_spec((ROOT / folder / name).read_text()), "spec")) == [], f"{folder}/{name}"
    assert list(undescribed(root_schema()["properties"]["spec"], "spec")) == []
    assert list(undescribed(_spec(scaler.crd_yaml()), "spec")) == []


def test_a_property_without_a_description_is_named() -> None:
    """Negative control: one description removed, the walk names that property and no other."""
    spec = copy.deepcopy(root_schema()["properties"]["spec"])
    del spec["properties"]["model"]["properties"]["maxModelLen"]["description"]
    del spec["properties"]["gateway"]["properties"]["inferencePool"]["properties"]["allowFrom"]["items"][
        "properties"]["ipBlock"]["properties"]["cidr"]["description"]
    assert list(undescribed(spec, "spec")) == [
        "spec.model.maxModelLen", "spec.gateway.inferencePool.allowFrom[].ipBlock.cidr"]


def test_each_spec_rule_has_the_same_words_in_validate_and_the_crd() -> None:
    crd_messages = [v["message"] for v in root_schema()["properties"]["spec"]["x-kubernetes-validations"]]
    assert crd_messages == [f"{r.spec_field}: {r.message}" for r in SPEC_RULES if r.cel]


def _cr(**changes: Any) -> dict[str, Any]:
    out = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    out["metadata"].update(changes.pop("metadata", {}))
    out["spec"].update(changes)
    return out


def test_the_name_rule_has_the_same_words_in_validate_and_the_crd() -> None:
    """validate said "String should match pattern '^[a-z]...'" where the API server said what a name may be."""
    (rule,) = root_schema()["x-kubernetes-validations"]
    for name in ("Bad_Name", "a" * 41, "9lives"):
        assert [str(e) for e in errors_of(_cr(metadata={"name": name}))] == [rule["message"]]
    assert rule["message"] == f"metadata.name: {NAME_MESSAGE}"


def test_a_validate_line_for_a_broken_rule_is_the_crds_message() -> None:
    """One broken rule, end to end: the line validate prints is the message the CRD's rule carries."""
    cr = _cr(prefill={"tensorParallelSize": 2, "resources": {"gpus": 0}}, decode={"resources": {"gpus": 0}})
    lines = [str(e) for e in errors_of(cr)]
    crd_messages = [v["message"] for v in root_schema()["properties"]["spec"]["x-kubernetes-validations"]]
    assert lines and all(line in crd_messages for line in lines), lines


def test_the_cidr_rule_has_the_same_words() -> None:
    ip_block = root_schema()["properties"]["spec"]["properties"]["gateway"]["properties"]["inferencePool"][
        "properties"]["allowFrom"]["items"]["properties"]["ipBlock"]["properties"]
    assert ip_block["cidr"]["x-kubernetes-validations"][0]["message"] == cidr.MESSAGE
    assert ip_block["except"]["items"]["x-kubernetes-validations"][0]["message"] == cidr.MESSAGE
