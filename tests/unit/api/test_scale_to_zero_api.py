"""spec.scaling.scaleToZero (issue 41): bad values and combinations are refused with the field named, by the
CRD's own admission (schema + CEL) and by the Python rules, which agree on a grid."""

from __future__ import annotations

import copy
import itertools
from typing import Any

import pytest

from crd_admission import admission_errors, assert_cel_agrees_with_python, disagreements  # noqa: E402
from pdfleet.operator.api import errors_of, parse
from pdfleet.operator.api.rules import SCALE_TO_ZERO_RULES

ZERO = {"replicas": 1, "autoscaling": {"minReplicas": 0, "maxReplicas": 4}}
ONE = {"replicas": 1, "autoscaling": {"minReplicas": 1, "maxReplicas": 4}}
ON = {"enabled": True, "idleSeconds": 300, "activationTimeoutSeconds": 120, "maxWaiting": 500}


def cr(prefill: dict = ZERO, decode: dict = ZERO, stz: Any = ON, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"model": {"name": "m"}, "prefill": copy.deepcopy(prefill),
                            "decode": copy.deepcopy(decode), **spec}
    if stz is not None:
        body["scaling"] = {"scaleToZero": copy.deepcopy(stz)}
    return {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
            "metadata": {"name": "llama", "namespace": "inference"}, "spec": body}


def test_the_pair_at_zero_is_valid_and_parsed() -> None:
    resource = cr()
    assert errors_of(resource) == [] and admission_errors(resource) == []
    s = parse(resource).spec.scaling.scale_to_zero
    assert (s.enabled, s.idle_seconds, s.activation_timeout_seconds, s.max_waiting) == (True, 300, 120, 500)


def test_defaults_when_only_enabled_is_set() -> None:
    s = parse(cr(stz={"enabled": True})).spec.scaling.scale_to_zero
    assert (s.idle_seconds, s.activation_timeout_seconds, s.max_waiting) == (300, 300, 1000)


BAD = [
    ("prefill floor 1", cr(prefill=ONE), "spec.scaling.scaleToZero.enabled"),
    ("decode floor 1", cr(decode=ONE), "spec.scaling.scaleToZero.enabled"),
    ("decode without autoscaling", cr(decode={"replicas": 1}), "spec.scaling.scaleToZero.enabled"),
    ("no front end", cr(router={"enabled": False}), "spec.scaling.scaleToZero.enabled"),
    ("idle 0", cr(stz={**ON, "idleSeconds": 0}), "spec.scaling.scaleToZero.idleSeconds"),
    ("idle past a week", cr(stz={**ON, "idleSeconds": 7 * 86_400 + 1}), "spec.scaling.scaleToZero.idleSeconds"),
    ("activation 0", cr(stz={**ON, "activationTimeoutSeconds": 0}),
     "spec.scaling.scaleToZero.activationTimeoutSeconds"),
    ("activation past an hour", cr(stz={**ON, "activationTimeoutSeconds": 3601}),
     "spec.scaling.scaleToZero.activationTimeoutSeconds"),
    ("maxWaiting 0", cr(stz={**ON, "maxWaiting": 0}), "spec.scaling.scaleToZero.maxWaiting"),
    ("maxWaiting unbounded", cr(stz={**ON, "maxWaiting": 100_001}), "spec.scaling.scaleToZero.maxWaiting"),
    ("maxWaiting a string", cr(stz={**ON, "maxWaiting": "many"}), "spec.scaling.scaleToZero.maxWaiting"),
    ("a misspelt field", cr(stz={**ON, "idleSecs": 5}), "spec.scaling.scaleToZero.idleSecs"),
]


@pytest.mark.parametrize("case,resource,field", BAD, ids=[b[0] for b in BAD])
def test_bad_scale_to_zero_is_refused_with_the_field_named(case: str, resource: dict, field: str) -> None:
    errors = errors_of(resource)
    assert [e for e in errors if e.field == field], f"{case}: {field} not named in {errors}"
    refused = admission_errors(resource)
    named = (field.removeprefix("spec."), f"'{field.rsplit('.', 1)[-1]}'", field.rsplit(".", 1)[-1])
    assert any(n in r for r in refused for n in named), f"{case}: the CRD admits it: {refused}"


def test_disabled_needs_nothing() -> None:
    """Negative control of the rules: enabled false (or no scaleToZero) with floors of 1 and no front end is fine."""
    for stz in ({**ON, "enabled": False}, None):
        resource = cr(prefill=ONE, decode={"replicas": 1}, stz=stz)
        assert errors_of(resource) == [] and admission_errors(resource) == [], stz


ROLES = [{"replicas": 1}, ONE, ZERO]
STZ = [None, {"enabled": False}, {"enabled": True}]


def _grid() -> list[dict[str, Any]]:
    return [{"model": {"name": "m"}, "prefill": p, "decode": d, "router": {"enabled": router},
             **({"scaling": {"scaleToZero": s}} if s is not None else {})}
            for p, d, s, router in itertools.product(ROLES, ROLES, STZ, (True, False))]


def test_scale_to_zero_cel_agrees_with_python() -> None:
    assert_cel_agrees_with_python(SCALE_TO_ZERO_RULES, _grid())


def test_scale_to_zero_cel_comparison_can_fail() -> None:
    """Negative control: a rule that checks only prefill's floor disagrees somewhere on the grid."""
    wrong = ("!(has(self.scaling.scaleToZero) && self.scaling.scaleToZero.enabled) || "
             "(has(self.prefill.autoscaling) && self.prefill.autoscaling.minReplicas == 0)")
    assert disagreements(wrong, SCALE_TO_ZERO_RULES[0], _grid()) > 0
