"""spec.kvOffload (issue 40 part 1): both roles by default; the capacity a positive quantity, the offload block
size a multiple of the engine's, no role twice, the pod's memory above the tier; each refused with the field
named by pdfleet's Python checks and by the CRD's admission (schema and CEL) alike."""

from __future__ import annotations

import copy
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import yaml

from crd_admission import admission_errors, assert_cel_agrees_with_python  # noqa: E402
from pdfleet.operator.api import errors_of, parse  # noqa: E402
from pdfleet.operator.api import quantity  # noqa: E402
from pdfleet.operator.api.rules import KV_OFFLOAD_RULES  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
FIELD = "spec.kvOffload"


def cr(offload: Any = None, **spec: Any) -> dict[str, Any]:
    out = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    if offload is not None:
        out["spec"]["kvOffload"] = copy.deepcopy(offload)
    for key, value in spec.items():
        out["spec"][key] = {**out["spec"].get(key, {}), **value}
    return out


def test_both_roles_by_default_and_none_without_the_block() -> None:
    o = parse(cr({"cpu": {"capacity": "16Gi"}})).spec.kv_offload
    assert o is not None and o.roles == ["prefill", "decode"] and o.block_size is None
    assert parse(cr()).spec.kv_offload is None


BAD = [
    ("capacity zero", {"cpu": {"capacity": "0"}}, {}, f"{FIELD}.cpu.capacity"),
    ("capacity negative", {"cpu": {"capacity": "-1Gi"}}, {}, f"{FIELD}.cpu.capacity"),
    ("capacity under a byte", {"cpu": {"capacity": "500m"}}, {}, f"{FIELD}.cpu.capacity"),
    ("capacity not a quantity", {"cpu": {"capacity": "lots"}}, {}, f"{FIELD}.cpu.capacity"),
    ("capacity a bad suffix", {"cpu": {"capacity": "1.5.5Gi"}}, {}, f"{FIELD}.cpu.capacity"),
    ("no capacity", {"cpu": {}}, {}, f"{FIELD}.cpu.capacity"),
    ("no roles", {"cpu": {"capacity": "1Gi"}, "roles": []}, {}, f"{FIELD}.roles"),
    ("unknown role", {"cpu": {"capacity": "1Gi"}, "roles": ["router"]}, {}, f"{FIELD}.roles[0]"),
    ("a role twice", {"cpu": {"capacity": "1Gi"}, "roles": ["decode", "decode"]}, {}, f"{FIELD}.roles"),
    ("block size not a multiple", {"cpu": {"capacity": "1Gi"}, "blockSize": 48}, {}, f"{FIELD}.blockSize"),
    ("tier above the pod's memory", {"cpu": {"capacity": "8Gi"}, "roles": ["decode"]},
     {"decode": {"resources": {"gpus": 0, "memory": "8Gi"}}}, "spec.decode.resources.memory"),
]


@pytest.mark.parametrize("case,offload,spec,field", BAD, ids=[b[0] for b in BAD])
def test_bad_offload_is_refused_with_the_field_named(case: str, offload: dict, spec: dict, field: str) -> None:
    errors = errors_of(cr(offload, **spec))
    assert [e for e in errors if e.field == field], f"{case}: {field} not named in {errors}"
    refused = admission_errors(cr(offload, **spec))
    path = field.removeprefix("spec.").split("[")[0]  # the schema says roles.0 where pydantic says roles[0]
    leaf = path.rsplit(".", 1)[-1]
    assert refused and any(path in r or leaf in r or "quantity" in r for r in refused), (
        f"{case}: the CRD admits it: {refused}")


GOOD = [
    ({"cpu": {"capacity": "16Gi"}}, {}),
    ({"cpu": {"capacity": "1"}, "roles": ["decode"], "blockSize": 64}, {}),
    ({"cpu": {"capacity": "2e9"}, "roles": ["prefill"]}, {"decode": {"resources": {"gpus": 0, "memory": "1Gi"}}}),
    ({"cpu": {"capacity": "1.5Gi"}}, {"prefill": {"resources": {"gpus": 0, "memory": "2Gi"}}}),
]


@pytest.mark.parametrize("offload,spec", GOOD)
def test_good_variants_are_admitted_everywhere(offload: dict, spec: dict) -> None:
    assert errors_of(cr(offload, **spec)) == [] and admission_errors(cr(offload, **spec)) == []


def test_cel_and_python_agree_on_the_offload_rules() -> None:
    specs = []
    for block in (None, 32, 48, 64):
        for roles in (None, ["prefill"], ["decode"], ["prefill", "decode"], ["decode", "decode"]):
            for memory in (None, "512Mi", "4Gi"):
                o: dict[str, Any] = {"cpu": {"capacity": "1Gi"}}
                if block is not None:
                    o["blockSize"] = block
                if roles is not None:
                    o["roles"] = roles
                res = {"resources": {"memory": memory}} if memory else {}
                specs.append({"model": {"name": "m"}, "engine": {"blockSize": 32}, "kvOffload": o,
                              "prefill": res, "decode": res})
    specs.append({"model": {"name": "m"}})  # no tier: every rule holds
    assert_cel_agrees_with_python(KV_OFFLOAD_RULES, specs)


@pytest.mark.parametrize("text", ["1", "16Gi", "1.5Gi", "2e9", "2E3", "100M", "5k", "0.5Ki", "1Ei", "+3", "12Mi",
                                  "1e-2", "250m", ".5", "3."])
def test_quantities_parse_as_the_kubernetes_client_does(text: str) -> None:
    from kubernetes.utils import parse_quantity

    assert quantity.parse(text) == Decimal(parse_quantity(text))


@pytest.mark.parametrize("text", ["", "Gi", "1.5.5", "1 Gi", "1GB", "1gi", "1e", "--1", "1Kii", "e3"])
def test_what_is_not_a_quantity_is_refused(text: str) -> None:
    with pytest.raises(quantity.BadQuantity):
        quantity.parse(text)
