"""spec.router.prefixScoring.tierWeights (issue 40): refused with the field named (CRD admission and operator
alike), rendered into the router's and the Endpoint Picker's args only when not the defaults, parsed back."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from crd_admission import admission_errors  # noqa: E402
from router_args import parsed, router_args  # noqa: E402
from pdfleet.contract.kv_tiers import DEFAULT_TIER_WEIGHTS, FLAG  # noqa: E402
from pdfleet.operator.api import errors_of, parse  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
FIELD = "spec.router.prefixScoring.tierWeights"


def cr(weights: Any = None) -> dict[str, Any]:
    out = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    out["spec"].setdefault("router", {})
    if weights is not None:
        out["spec"]["router"]["prefixScoring"] = {"tierWeights": copy.deepcopy(weights)}
    return out


def test_the_defaults_leave_the_router_pod_template_as_before() -> None:
    w = parse(cr()).spec.router.prefix_scoring.tier_weights
    assert (w.gpu, w.cpu, w.storage) == tuple(v for _, v in DEFAULT_TIER_WEIGHTS) == (1.0, 0.75, 0.25)
    before = router_args(cr())
    assert FLAG not in before and parsed(before).prefix_tier_weights == DEFAULT_TIER_WEIGHTS
    assert router_args(cr({"GPU": 1.0, "CPU": 0.75})) == before
    assert router_args(cr({"CPU": 0.5})) != before  # negative control: another weight does change it


@pytest.mark.parametrize("weights, expected", [
    ({"CPU": 0.5}, (("GPU", 1.0), ("CPU", 0.5), ("STORAGE", 0.25))),
    ({"CPU": 0, "STORAGE": 0}, (("GPU", 1.0), ("CPU", 0.0), ("STORAGE", 0.0))),  # GPU only, as before tiers
    ({"GPU": 0.9, "CPU": 1, "STORAGE": 1}, (("GPU", 0.9), ("CPU", 1.0), ("STORAGE", 1.0))),
])
def test_the_plan_passes_the_weights_and_the_router_parses_them_back(weights, expected) -> None:
    assert parsed(router_args(cr(weights))).prefix_tier_weights == expected


BAD = [
    ("above 1", {"CPU": 1.5}, f"{FIELD}.CPU"),
    ("negative", {"STORAGE": -0.1}, f"{FIELD}.STORAGE"),
    ("not a number", {"GPU": "high"}, f"{FIELD}.GPU"),
    ("unknown tier", {"DISK": 0.25}, f"{FIELD}.DISK"),
    ("every tier at 0", {"GPU": 0, "CPU": 0, "STORAGE": 0}, FIELD),
]


@pytest.mark.parametrize("case,weights,field", BAD, ids=[b[0] for b in BAD])
def test_bad_weights_are_refused_with_the_field_named(case: str, weights: dict, field: str) -> None:
    errors = errors_of(cr(weights))
    assert [e for e in errors if e.field == field], f"{case}: {field} not named in {errors}"
    refused = admission_errors(cr(weights))
    leaf = field.rsplit(".", 1)[-1]
    assert any(field.removeprefix("spec.") in r or leaf in r for r in refused), f"{case}: the CRD admits it: {refused}"


def test_good_variants_are_admitted_everywhere() -> None:
    for weights in ({}, {"CPU": 0.8}, {"GPU": 0, "CPU": 1}, {"CPU": 0, "STORAGE": 0}, {"GPU": 1, "CPU": 1, "STORAGE": 1}):
        assert errors_of(cr(weights)) == [] and admission_errors(cr(weights)) == [], weights


def test_cel_and_python_agree_on_the_tier_weights_rule() -> None:
    from crd_admission import assert_cel_agrees_with_python
    from pdfleet.operator.api.rules import PREFIX_SCORING_RULES

    grid = [{"GPU": g, "CPU": c, "STORAGE": s} for g in (0, 0.5, 1) for c in (0, 0.75) for s in (0, 0.25)]
    specs = [{"model": {"name": "m"}, "router": {"prefixScoring": {"tierWeights": w}}} for w in grid]
    assert_cel_agrees_with_python(PREFIX_SCORING_RULES, specs)
