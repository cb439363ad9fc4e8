"""Autoscaling API: bad bounds, ratios and planner settings are refused with the field named,
by the CRD's own admission (schema + CEL) where it can say it, else by the operator's rules;
the scaler CRD is generated, structural, valid and committed without drift."""

from __future__ import annotations

import copy
import itertools
from pathlib import Path
from typing import Any, Optional

import kubernetes_validate
import pytest
import yaml

from crd_admission import admission_errors, assert_cel_agrees_with_python, disagreements  # noqa: E402
from pdfleet.operator.api import DisaggregatedInferenceSpec, errors_of, parse, scaler
from pdfleet.operator.api.rules import SCALING_RULES, ratio_satisfiable

ROOT = Path(__file__).resolve().parents[3]


def cr(prefill: Optional[dict] = None, decode: Optional[dict] = None, scaling: Optional[dict] = None,
       **spec: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
        "metadata": {"name": "llama", "namespace": "inference"},
        "spec": {"model": {"name": "m"}, **spec},
    }
    for key, value in (("prefill", prefill), ("decode", decode), ("scaling", scaling)):
        if value is not None:
            out["spec"][key] = copy.deepcopy(value)
    return out


AUTO = {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 8}}
PLANNER = {"enabled": True, "ttftMs": 800, "itlMs": 60, "intervalSeconds": 30, "scaleDownDelaySeconds": 300}


def test_the_issue_example_is_valid_and_parsed() -> None:
    resource = cr({"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 8}},
                  {"replicas": 2, "autoscaling": {"minReplicas": 1, "maxReplicas": 16}},
                  {"ratio": {"min": 0.25, "max": 2.0}, "planner": PLANNER})
    assert errors_of(resource) == [] and admission_errors(resource) == []
    spec = parse(resource).spec
    assert spec.decode.autoscaling.max_replicas == 16 and spec.scaling.ratio.min == 0.25
    assert spec.scaling.planner.scale_down_delay_seconds == 300 and spec.scaling.planner.itl_ms == 60


# (case, resource, field named, refused by the CRD too)
BAD = [
    ("min>max", cr({"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}),
     "spec.prefill.autoscaling.minReplicas", True),
    ("decode min>max", cr(decode={"autoscaling": {"minReplicas": 3, "maxReplicas": 1}}),
     "spec.decode.autoscaling.minReplicas", True),
    ("ratio min>max", cr(scaling={"ratio": {"min": 2.0, "max": 1.0}}), "spec.scaling.ratio.min", True),
    ("ratio unreachable: fixed sizes", cr({"replicas": 4}, {"replicas": 1}, {"ratio": {"max": 2.0}}),
     "spec.scaling.ratio", True),
    ("ratio unreachable: bounds", cr({"autoscaling": {"minReplicas": 6, "maxReplicas": 8}},
                                    {"autoscaling": {"minReplicas": 1, "maxReplicas": 2}}, {"ratio": {"max": 2.0}}),
     "spec.scaling.ratio", True),
    ("ratio unsatisfiable in whole numbers", cr({"replicas": 1}, {"autoscaling": {"minReplicas": 2, "maxReplicas": 3}},
                                                {"ratio": {"min": 0.35, "max": 0.45}}),
     "spec.scaling.ratio", False),
    ("ttft 0", cr(AUTO, scaling={"planner": {**PLANNER, "ttftMs": 0}}), "spec.scaling.planner.ttftMs", True),
    ("itl negative", cr(AUTO, scaling={"planner": {**PLANNER, "itlMs": -5}}), "spec.scaling.planner.itlMs", True),
    ("interval 0", cr(AUTO, scaling={"planner": {**PLANNER, "intervalSeconds": 0}}),
     "spec.scaling.planner.intervalSeconds", True),
    ("ratio 0", cr(scaling={"ratio": {"min": 0}}), "spec.scaling.ratio.min", True),
    ("planner without router", cr(AUTO, router={"enabled": False}, scaling={"planner": PLANNER}),
     "spec.scaling.planner.enabled", True),
    ("planner without autoscaling", cr(scaling={"planner": PLANNER}), "spec.scaling.planner.enabled", True),
    ("max missing", cr({"autoscaling": {"minReplicas": 1}}), "spec.prefill.autoscaling.maxReplicas", True),
]


@pytest.mark.parametrize("case,resource,field,crd_refuses", BAD, ids=[b[0] for b in BAD])
def test_bad_scaling_is_refused_with_the_field_named(case: str, resource: dict, field: str, crd_refuses: bool) -> None:
    errors = errors_of(resource)
    assert [e for e in errors if e.field == field], f"{case}: {field} not named in {errors}"
    refused = admission_errors(resource)
    if crd_refuses:
        # CEL messages carry the path; schema errors the parent path and the property's name
        named = (field.removeprefix("spec."), f"'{field.rsplit('.', 1)[-1]}'")
        assert any(n in r for r in refused for n in named), f"{case}: the CRD admits it: {refused}"
    else:
        assert refused == [], f"{case}: CEL cannot say it, the operator does: {refused}"


def test_good_variants_are_admitted_everywhere() -> None:
    for resource in (cr(AUTO), cr(AUTO, AUTO, {"ratio": {"min": 0.5}}), cr(scaling={"ratio": {"max": 1.0}}),
                     cr({"replicas": 1}, {"replicas": 3}, {"ratio": {"min": 0.3, "max": 0.4}}),
                     cr({"autoscaling": {"minReplicas": 0, "maxReplicas": 0}}, scaling={"planner": {"enabled": False}})):
        assert errors_of(resource) == [] and admission_errors(resource) == [], resource


@pytest.mark.parametrize("p,d,low,high,ok", [
    ((1, 1), (3, 3), 0.4, 0.5, False),   # 1/3 falls between
    ((1, 1), (2, 3), 0.4, 0.5, True),    # 1/2
    ((4, 4), (1, 16), 0.25, 0.25, True),  # 4/16
    ((5, 5), (1, 16), 0.25, 0.3, False),  # needs 17 <= decode <= 20
    ((0, 2), (0, 0), None, 1.0, True),   # nothing and nothing
])
def test_ratio_satisfiable_in_whole_numbers(p, d, low, high, ok) -> None:
    ratio = {k: v for k, v in (("min", low), ("max", high)) if v is not None}
    spec = DisaggregatedInferenceSpec.model_validate({
        "model": {"name": "m"}, "prefill": {"autoscaling": {"minReplicas": p[0], "maxReplicas": p[1]}},
        "decode": {"autoscaling": {"minReplicas": d[0], "maxReplicas": d[1]}}, "scaling": {"ratio": ratio}})
    assert ratio_satisfiable(spec) is ok


# CEL and Python agree on a grid where every scaling rule is kept and broken somewhere.
ROLE_VALUES = [{"replicas": 2}, {"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}},
               {"autoscaling": {"minReplicas": 5, "maxReplicas": 2}}, {"autoscaling": {"minReplicas": 6, "maxReplicas": 9}}]
RATIOS = [None, {"min": 0.5}, {"max": 0.5}, {"min": 2.0, "max": 1.0}, {"min": 0.25, "max": 2.0}]
PLANNERS = [None, {"enabled": False}, {"enabled": True}]
ROUTERS = [True, False]


def _grid() -> list[dict[str, Any]]:
    out = []
    for p, d, ratio, planner, router in itertools.product(ROLE_VALUES, ROLE_VALUES, RATIOS, PLANNERS, ROUTERS):
        scaling = {k: v for k, v in (("ratio", ratio), ("planner", planner)) if v is not None}
        out.append({"model": {"name": "m"}, "prefill": p, "decode": d, "scaling": scaling,
                    "router": {"enabled": router}})
    return out


def test_scaling_cel_agrees_with_python() -> None:
    assert_cel_agrees_with_python(SCALING_RULES, _grid())


def test_scaling_cel_comparison_can_fail() -> None:
    """Negative control: a ratio rule that forgets the decode bound disagrees somewhere."""
    wrong = "!has(self.scaling.ratio) || !has(self.scaling.ratio.max) || self.prefill.replicas <= self.decode.replicas"
    rule = next(r for r in SCALING_RULES if r.field == "scaling.ratio")
    assert disagreements(wrong, rule, _grid()) > 0


# --- the scaler CRD ------------------------------------------------------------

COMMITTED = ROOT / "crds" / "pdfleet.io_disaggregatedinferencescalers.yaml"
CHART = ROOT / "charts" / "pdfleet" / "crds" / "pdfleet.io_disaggregatedinferencescalers.yaml"


def test_committed_scaler_crd_equals_generated() -> None:
    assert COMMITTED.read_text() == scaler.crd_yaml(), "crds/ drifted from the scaler model: run `make crds`"
    assert CHART.read_text() == scaler.crd_yaml(), "the chart's scaler CRD drifted: run `make crds`"


@pytest.mark.parametrize("version", ["1.30.0", "1.33.0"])
def test_scaler_crd_is_a_valid_apiextensions_object(version: str) -> None:
    kubernetes_validate.validate(scaler.crd(), version, strict=True)


def test_scaler_crd_names_and_scale_subresource() -> None:
    spec = scaler.crd()["spec"]
    assert spec["group"] == "pdfleet.io" and spec["scope"] == "Namespaced"
    assert spec["names"]["kind"] == "DisaggregatedInferenceScaler" and spec["names"]["shortNames"] == ["dinfscaler"]
    (version,) = spec["versions"]
    assert version["name"] == "v1alpha1"
    assert version["subresources"]["scale"] == {"specReplicasPath": ".spec.replicas",
                                                "statusReplicasPath": ".status.replicas",
                                                "labelSelectorPath": ".status.selector"}
    root = version["schema"]["openAPIV3Schema"]
    assert root["properties"]["spec"]["required"] == ["replicas"]
    assert yaml.safe_load(scaler.crd_yaml()) == scaler.crd()


def test_pdfleet_crd_command_emits_the_scaler_crd(tmp_path: Path) -> None:
    from pdfleet.operator.cli import main
    out = tmp_path / "scaler.yaml"
    assert main(["crd", "--kind", "scaler", "-o", str(out)]) == 0
    assert out.read_text() == scaler.crd_yaml()
