"""Generate the DisaggregatedInference CRD from the API types.

pydantic's JSON schema is turned into a Kubernetes *structural* schema: $refs
inlined, no title / $defs / additionalProperties: false, `null` branches
dropped (the API server prunes nulls), int-or-string marked, free-form objects
marked to preserve unknown fields, nested objects defaulted to {} so that the
server fills their defaults and CEL rules can rely on them.
"""

from __future__ import annotations

from typing import Any

import yaml

from pdfleet.operator.api.conditions import READY
from pdfleet.operator.api.rules import SPEC_RULES
from pdfleet.operator.api.types import (
    CATEGORIES,
    DNS1035_LABEL,
    GROUP,
    KIND,
    MAX_NAME_LENGTH,
    NAME_MESSAGE,
    PLURAL,
    SHORT_NAMES,
    SINGULAR,
    VERSION,
    DisaggregatedInferenceSpec,
    DisaggregatedInferenceStatus,
)

CRD_NAME = f"{PLURAL}.{GROUP}"
_OPTIONAL = "x-pdfleet-optional"  # internal marker, removed before output
_KEEP = {
    "type", "description", "properties", "required", "items", "enum", "default", "format",
    "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "minLength", "maxLength",
    "pattern", "minItems", "maxItems", "additionalProperties", "x-kubernetes-validations",
}  # fmt: skip


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        if "$ref" in node:
            target = _resolve(defs[node["$ref"].split("/")[-1]], defs)
            extra = {k: v for k, v in node.items() if k != "$ref"}
            return {**target, **_resolve(extra, defs)}
        return {k: _resolve(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, defs) for v in node]
    return node


def _without_null(branches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [b for b in branches if b.get("type") != "null"]


def _structural(node: dict[str, Any]) -> dict[str, Any]:
    """One pydantic schema node as a structural schema node."""
    if "anyOf" in node:
        branches = _without_null(node["anyOf"])
        outer = {k: v for k, v in node.items() if k in ("description", "default") and v is not None}
        if len(branches) == 1:
            # Optional[...] fields stay absent unless set: never default them to {}.
            optional = len(branches) < len(node["anyOf"])
            return {**_structural({**branches[0], **outer}), **({_OPTIONAL: True} if optional else {})}
        types = {b.get("type") for b in branches}
        if types == {"integer", "string"}:
            return {**outer, "x-kubernetes-int-or-string": True}
        raise ValueError(f"cannot express union {types} in a structural schema")

    out: dict[str, Any] = {}
    if "const" in node:
        out["enum"] = [node["const"]]
    for key, value in node.items():
        if key not in _KEEP or (key == "default" and value is None):
            continue
        if key == "properties":
            out[key] = {name: _structural(sub) for name, sub in value.items()}
        elif key == "items":
            out[key] = _structural(value)
        elif key == "additionalProperties":
            if value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
            elif isinstance(value, dict):
                out[key] = _structural(value)
        else:
            out[key] = value
    if out.get("type") == "object" and "properties" in out:
        required = set(out.get("required", []))
        for name, sub in out["properties"].items():
            optional = sub.pop(_OPTIONAL, False)
            if sub.get("type") == "object" and "properties" in sub and not (optional or name in required):
                sub.setdefault("default", {})
    return out


def structural_schema(model: type) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema = _structural(_resolve({k: v for k, v in raw.items() if k != "$defs"}, raw.get("$defs", {})))
    schema.pop(_OPTIONAL, None)
    return schema


def spec_schema() -> dict[str, Any]:
    schema = structural_schema(DisaggregatedInferenceSpec)
    schema["x-kubernetes-validations"] = [
        {"rule": r.cel, "message": f"{r.spec_field}: {r.message}", "fieldPath": f".{r.field}"}
        for r in SPEC_RULES
        if r.cel
    ]
    return schema


def status_schema() -> dict[str, Any]:
    schema = structural_schema(DisaggregatedInferenceStatus)
    conditions = schema["properties"]["conditions"]
    conditions["x-kubernetes-list-type"] = "map"
    conditions["x-kubernetes-list-map-keys"] = ["type"]
    return schema


def _printer_columns() -> list[dict[str, Any]]:
    def col(name: str, path: str, type_: str = "string", priority: int = 0) -> dict[str, Any]:
        c = {"name": name, "type": type_, "jsonPath": path}
        return {**c, "priority": priority} if priority else c

    return [
        col("Model", ".spec.model.name"),
        # As the status reports them (an autoscaler's choice, not spec.<role>.replicas, the starting size).
        col("Prefill-Ready", ".status.prefill.readyReplicas", "integer"),
        col("Prefill", ".status.prefill.desiredReplicas", "integer"),
        col("Decode-Ready", ".status.decode.readyReplicas", "integer"),
        col("Decode", ".status.decode.desiredReplicas", "integer"),
        col(READY, f'.status.conditions[?(@.type=="{READY}")].status'),
        col("Reason", f'.status.conditions[?(@.type=="{READY}")].reason'),
        col("Canary", ".status.rollout.weight", "integer"),
        col("Revision", ".status.revision", priority=1),
        col("URL", ".status.url", priority=1),
        col("Age", ".metadata.creationTimestamp", "date"),
    ]


def crd() -> dict[str, Any]:
    root = {
        "type": "object",
        "description": "A vLLM prefill/decode disaggregated inference fleet whose KV cache moves over NIXL.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec_schema(),
            "status": status_schema(),
        },
        "x-kubernetes-validations": [
            {
                "rule": f"self.metadata.name.size() <= {MAX_NAME_LENGTH}"
                f" && self.metadata.name.matches('{DNS1035_LABEL}')",
                "message": f"metadata.name: {NAME_MESSAGE}",
            }
        ],
    }
    return crd_document(
        name=CRD_NAME, kind=KIND, plural=PLURAL, singular=SINGULAR, short_names=SHORT_NAMES,
        categories=CATEGORIES, subresources={"status": {}}, columns=_printer_columns(), root=root,
    )


def crd_document(
    *, name: str, kind: str, plural: str, singular: str, short_names: list[str], categories: list[str],
    subresources: dict[str, Any], columns: list[dict[str, Any]], root: dict[str, Any],
) -> dict[str, Any]:
    """The CustomResourceDefinition around one namespaced pdfleet.io kind's schema (every pdfleet CRD)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/name": "pdfleet", "app.kubernetes.io/part-of": "pdfleet"},
        },
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": singular,
                "shortNames": list(short_names),
                "categories": list(categories),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": subresources,
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }


HEADER = "# Generated by `pdfleet crd` from pdfleet.operator.api; do not edit. Regenerate with `make crds`.\n"


def crd_yaml() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=120)
