"""What the API server does with a DisaggregatedInference, offline.

Strict field validation (unknown fields refused), defaulting from the CRD,
OpenAPI v3 validation (jsonschema) and the CRD's CEL rules (cel-python), all
driven by the generated CRD, so that a test can show a bad resource is refused
by the cluster's own admission and not only by pdfleet's Python checks.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from typing import Any, Iterable, Sequence

import celpy
import jsonschema

from pdfleet.operator.api import DisaggregatedInferenceSpec
from pdfleet.operator.api.crd import crd
from pdfleet.operator.api import quantity


def root_schema() -> dict[str, Any]:
    return crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _apply_defaults(obj: Any, schema: dict[str, Any]) -> None:
    if isinstance(obj, dict) and "properties" in schema:
        for name, sub in schema["properties"].items():
            if name not in obj and "default" in sub:
                obj[name] = copy.deepcopy(sub["default"])
            if name in obj:
                _apply_defaults(obj[name], sub)
    elif isinstance(obj, list) and "items" in schema:
        for item in obj:
            _apply_defaults(item, schema["items"])


def _unknown_fields(obj: Any, schema: dict[str, Any], path: str) -> list[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields"):
        return []
    errors: list[str] = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        if props is None:
            extra = schema.get("additionalProperties")
            return [e for k, v in obj.items() for e in _unknown_fields(v, extra or {}, f"{path}.{k}")]
        for key, value in obj.items():
            if key not in props:
                errors.append(f"{path}.{key}: unknown field")
            else:
                errors += _unknown_fields(value, props[key], f"{path}.{key}")
    elif isinstance(obj, list) and "items" in schema:
        for i, item in enumerate(obj):
            errors += _unknown_fields(item, schema["items"], f"{path}[{i}]")
    return errors


def _is_sorted(values: Any) -> Any:
    """Kubernetes' CEL list library `isSorted()` (cel-python lacks it)."""
    return celpy.celtypes.BoolType(all(a <= b for a, b in zip(values, values[1:])))


def _is_quantity(value: Any) -> Any:
    """Kubernetes' CEL quantity library (k8s >= 1.29; cel-python lacks it): isQuantity, quantity, and the
    comparisons, on the quantity's value (pdfleet.operator.api.quantity parses it as apimachinery does)."""
    try:
        quantity.parse(str(value))
    except quantity.BadQuantity:
        return celpy.celtypes.BoolType(False)
    return celpy.celtypes.BoolType(True)


def _quantity(value: Any) -> Any:
    return celpy.celtypes.DoubleType(float(quantity.parse(str(value))))  # raises (a CEL error) when not one


K8S_CEL_FUNCTIONS = {"isSorted": _is_sorted, "isQuantity": _is_quantity, "quantity": _quantity,
                     "isLessThan": lambda a, b: celpy.celtypes.BoolType(a < b),
                     "isGreaterThan": lambda a, b: celpy.celtypes.BoolType(a > b)}


def _cel(rules: list[dict[str, Any]], value: Any) -> list[str]:
    env = celpy.Environment()
    activation = {"self": celpy.json_to_cel(value)}
    failed = []
    for rule in rules:
        result = env.program(env.compile(rule["rule"]), functions=K8S_CEL_FUNCTIONS).evaluate(activation)
        if isinstance(result, Exception) or not bool(result):
            failed.append(rule["message"])
    return failed


def admission_errors(resource: dict[str, Any]) -> list[str]:
    """Reasons the API server would refuse this resource; empty when it admits it."""
    schema = root_schema()
    obj = copy.deepcopy(resource)
    errors = [e for k in ("spec",) if k in obj for e in _unknown_fields(obj[k], schema["properties"][k], k)]
    if errors:
        return errors
    _apply_defaults(obj, schema)
    validator = jsonschema.Draft7Validator(schema)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    if errors:
        return errors
    errors = _cel(schema["x-kubernetes-validations"], obj)
    errors += _cel(schema["properties"]["spec"]["x-kubernetes-validations"], obj["spec"])
    return errors + _field_cel(obj["spec"], schema["properties"]["spec"])


def _field_cel(value: Any, schema: dict[str, Any]) -> list[str]:
    """The rules set on fields below the spec (e.g. a CIDR's), each with the value at its field as self."""
    errors: list[str] = []
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                errors += _cel(sub.get("x-kubernetes-validations", []), value[name])
                errors += _field_cel(value[name], sub)
    elif isinstance(value, list) and "items" in schema:
        for item in value:
            errors += _cel(schema["items"].get("x-kubernetes-validations", []), item)
            errors += _field_cel(item, schema["items"])
    return errors


# --- a rule's CEL against its Python check ----------------------------------------------------------

@lru_cache(maxsize=1)
def _schema() -> dict[str, Any]:
    return root_schema()


@lru_cache(maxsize=None)
def _program(expression: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(expression), functions=K8S_CEL_FUNCTIONS)


def defaulted_spec(spec: dict[str, Any]) -> dict[str, Any]:
    """The spec as the API server hands it to CEL: a copy with the CRD's defaults filled in."""
    obj = {"spec": copy.deepcopy(spec)}
    _apply_defaults(obj, _schema())
    return obj["spec"]


def cel_results(expressions: Sequence[str], spec: dict[str, Any]) -> list[bool]:
    """Each CEL expression (``self``: the spec after defaulting) on the spec."""
    activation = {"self": celpy.json_to_cel(defaulted_spec(spec))}
    return [bool(_program(e).evaluate(activation)) for e in expressions]


def python_results(rules: Sequence[Any], spec: dict[str, Any]) -> list[bool]:
    model = DisaggregatedInferenceSpec.model_validate(spec)
    return [r.check(model) for r in rules]


def assert_cel_agrees_with_python(rules: Sequence[Any], specs: Sequence[dict[str, Any]]) -> None:
    """Every rule's CEL and its Python check agree on every spec, and each rule is kept by some spec
    and broken by another, so that the agreement is not vacuous."""
    broken = [0] * len(rules)
    for spec in specs:
        python = python_results(rules, spec)
        assert cel_results([r.cel for r in rules], spec) == python, spec
        broken = [b + (not ok) for b, ok in zip(broken, python)]
    assert all(0 < b < len(specs) for b in broken), {r.field: b for r, b in zip(rules, broken)}


def disagreements(wrong_cel: str, rule: Any, specs: Iterable[dict[str, Any]]) -> int:
    """On how many specs a CEL expression and a rule's Python check disagree (a negative control's
    wrong expression must disagree somewhere)."""
    return sum(cel_results([wrong_cel], s)[0] != python_results([rule], s)[0] for s in specs)
