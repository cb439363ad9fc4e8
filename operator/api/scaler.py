"""DisaggregatedInferenceScaler v1alpha1: one role's scale target, and its CRD.

The operator creates one per autoscaled role, named `<fleet>-<role>` (stable across
rollouts) and owned by the fleet. HPA, KEDA, `kubectl scale` and pdfleet's planner write
`.spec.replicas` through the `/scale` subresource; the operator clamps that value to the
role's min/max and the fleet's prefill:decode ratio, applies it to the role's StatefulSet
and reports the result in `.status` (`replicas`, `selector` for HPA's pod metrics).
"""

from __future__ import annotations

from typing import Any, Optional

import yaml
from pydantic import Field

from pdfleet.operator.api.crd import HEADER, crd_document, structural_schema
from pdfleet.operator.api.types import GROUP, VERSION, Model, ObjectMeta, Replicas

KIND = "DisaggregatedInferenceScaler"
PLURAL = "disaggregatedinferencescalers"
SINGULAR = "disaggregatedinferencescaler"
SHORT_NAMES = ["dinfscaler"]
CRD_NAME = f"{PLURAL}.{GROUP}"
API_VERSION = f"{GROUP}/{VERSION}"


class ScalerSpec(Model):
    replicas: Replicas = Field(description="Replicas asked for (by an HPA, KEDA, kubectl scale or the planner).")


class ScalerStatus(Model):
    observed_generation: Optional[int] = None
    replicas: int = Field(default=0, description="Replicas applied to the role after clamping.")
    selector: str = Field(default="", description="Label selector of the role's pods (for HPA pod metrics).")
    requested_replicas: int = Field(default=0, description="spec.replicas as last seen.")
    clamped: bool = False
    reason: str = Field(default="", description="Why replicas differs from requestedReplicas.")


class DisaggregatedInferenceScaler(Model):
    api_version: str = API_VERSION
    kind: str = KIND
    metadata: ObjectMeta
    spec: ScalerSpec
    status: Optional[ScalerStatus] = None


def scaler_name(fleet: str, role: str) -> str:
    return f"{fleet}-{role}"


def crd() -> dict[str, Any]:
    spec = structural_schema(ScalerSpec)
    status = structural_schema(ScalerStatus)
    root = {
        "type": "object",
        "description": "The scale target of one role of a DisaggregatedInference (created by the operator).",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": spec,
            "status": status,
        },
    }
    columns = [
        {"name": "Desired", "type": "integer", "jsonPath": ".spec.replicas"},
        {"name": "Replicas", "type": "integer", "jsonPath": ".status.replicas"},
        {"name": "Reason", "type": "string", "jsonPath": ".status.reason"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    return crd_document(
        name=CRD_NAME, kind=KIND, plural=PLURAL, singular=SINGULAR, short_names=SHORT_NAMES,
        categories=["pdfleet"], columns=columns, root=root,
        subresources={
            "status": {},
            "scale": {
                "specReplicasPath": ".spec.replicas",
                "statusReplicasPath": ".status.replicas",
                "labelSelectorPath": ".status.selector",
            },
        },
    )


def crd_yaml() -> str:
    return HEADER + yaml.safe_dump(crd(), sort_keys=False, width=120)
