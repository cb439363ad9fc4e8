"""What the API server does with a DisaggregatedInference, offline.

Strict field validation (unknown fields refused), defaulting from the CRD,
OpenAPI v3 validation (jsonschema) and the CRD's CEL rules (cel-python), all
driven by the generated CRD, so that a test can show a bad resource is refused
by the cluster's own admission and not only by pdfleet's Python checks.
"""

from __future__ import annotations

import copy
from typing import Any

import celpy
import jsonschema

from pdfleet.operator.api.crd import crd


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


K8S_CEL_FUNCTIONS = {"isSorted": _is_sorted}


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
    return errors
