"""Validate objects against a vendored third-party CRD's own OpenAPI schema, as the API server would:
strict field validation (unknown fields refused, as `kubectl apply` does by default), then the
schema's types, enums, required fields and bounds, then the CEL rules (x-kubernetes-validations) a
CRD carries (cel-python, with the schema's defaults applied first, as the API server does)."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

CRDS = Path(__file__).resolve().parents[1] / "crds"  # tests/crds: the vendored third-party CRDs
FILES = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): "leaderworkerset.x-k8s.io_leaderworkersets.yaml",
    ("scheduling.volcano.sh/v1beta1", "PodGroup"): "scheduling.volcano.sh_podgroups.yaml",
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"): "scheduling.x-k8s.io_podgroups.yaml",
    ("inference.networking.k8s.io/v1", "InferencePool"): "inference.networking.k8s.io_inferencepools.yaml",
    ("gateway.networking.k8s.io/v1", "GatewayClass"): "gateway.networking.k8s.io_gatewayclasses.yaml",
    ("gateway.networking.k8s.io/v1", "Gateway"): "gateway.networking.k8s.io_gateways.yaml",
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): "gateway.networking.k8s.io_httproutes.yaml",
}


@functools.cache
def schema_of(api_version: str, kind: str) -> dict[str, Any]:
    crd = yaml.safe_load((CRDS / FILES[(api_version, kind)]).read_text())
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group and crd["spec"]["names"]["kind"] == kind
    (found,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return found["schema"]["openAPIV3Schema"]


def _unknown(obj: Any, schema: dict[str, Any], path: str) -> list[str]:
    if schema.get("x-kubernetes-preserve-unknown-fields") or path == ".metadata":
        return []
    out: list[str] = []
    if isinstance(obj, dict):
        props = schema.get("properties")
        if props is None:
            extra = schema.get("additionalProperties")
            return [e for k, v in obj.items() for e in _unknown(v, extra if isinstance(extra, dict) else {}, f"{path}.{k}")]
        for key, value in obj.items():
            out += [f"{path}.{key}: unknown field"] if key not in props else _unknown(value, props[key], f"{path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            out += _unknown(item, schema["items"], f"{path}[{i}]")
    return out


def _defaulted(obj: Any, schema: dict[str, Any]) -> Any:
    if isinstance(obj, dict) and "properties" in schema:
        out = dict(obj)
        for key, sub in schema["properties"].items():
            if key not in out and "default" in sub:
                out[key] = copy.deepcopy(sub["default"])
            if key in out:
                out[key] = _defaulted(out[key], sub)
        return out
    if isinstance(obj, list) and isinstance(schema.get("items"), dict):
        return [_defaulted(item, schema["items"]) for item in obj]
    return obj


def _cel(obj: Any, schema: dict[str, Any], path: str) -> list[str]:
    out: list[str] = []
    for rule in schema.get("x-kubernetes-validations") or ():
        if "oldSelf" in rule["rule"]:
            continue  # a transition rule: the API server checks it on updates only
        env = celpy.Environment()
        result = env.program(env.compile(rule["rule"])).evaluate({"self": celpy.json_to_cel(obj)})
        if isinstance(result, Exception) or not bool(result):
            out.append(f"{path}: {rule.get('message', rule['rule'])}")
    if isinstance(obj, dict):
        for key, sub in (schema.get("properties") or {}).items():
            if key in obj:
                out += _cel(obj[key], sub, f"{path}.{key}")
    elif isinstance(obj, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(obj):
            out += _cel(item, schema["items"], f"{path}[{i}]")
    return out


def errors(obj: dict[str, Any]) -> list[str]:
    schema = schema_of(obj["apiVersion"], obj["kind"])
    found = _unknown(obj, schema, "")
    validator = jsonschema.Draft7Validator(schema)
    found += [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(obj)]
    return found + (_cel(_defaulted(obj, schema), schema, "") if not found else [])
