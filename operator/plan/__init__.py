"""The fleet plan: a DisaggregatedInference in, every child object out. No I/O.

The operator applies what `plan` returns; `pdfleet render` prints it; tests
table-test it. Children of one revision are named after it, so a paired rollout
can run the old and the new prefill/decode side by side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

from pdfleet.operator.api import DisaggregatedInference, parse
from pdfleet.operator.plan import engines, gateway, naming, policy, roles, router
from pdfleet.operator.plan.meta import Context, owner_reference

DEFAULT_IMAGE = "ghcr.io/pdfleet/pdfleet-runtime:0.1.0"
ROLES = ("prefill", "decode")
KIND_ORDER = (
    "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service", "PodGroup", "StatefulSet",
    "LeaderWorkerSet", "Deployment", "PodDisruptionBudget", "NetworkPolicy", "InferencePool",
)  # fmt: skip


@dataclass(frozen=True)
class PlanOptions:
    default_image: str = DEFAULT_IMAGE
    namespace: Optional[str] = None  # overrides metadata.namespace
    owner: Optional[dict[str, Any]] = None  # controller owner reference put on every child
    serving_revision: Optional[str] = None  # revision that serves new requests; default: the current one
    # A canary: percent of new requests the router sends to the current revision while another serves.
    canary_weight: Optional[int] = None


def image_of(resource: DisaggregatedInference, options: PlanOptions = PlanOptions()) -> str:
    return resource.spec.image or options.default_image


def revision_of(resource: DisaggregatedInference, options: PlanOptions = PlanOptions()) -> str:
    return naming.revision(resource.spec, image_of(resource, options))


def context(resource: DisaggregatedInference, options: PlanOptions = PlanOptions()) -> Context:
    namespace = options.namespace or resource.metadata.namespace or "default"
    return Context(
        fleet=resource.metadata.name,
        namespace=namespace,
        revision=revision_of(resource, options),
        image=image_of(resource, options),
        owner=options.owner,
    )


def _sort_key(obj: dict[str, Any]) -> tuple[int, str]:
    return KIND_ORDER.index(obj["kind"]), obj["metadata"]["name"]


def plan(
    resource: Union[DisaggregatedInference, Mapping[str, Any]], options: PlanOptions = PlanOptions()
) -> list[dict[str, Any]]:
    """Every child of the fleet at its current revision, in a deterministic order."""
    if not isinstance(resource, DisaggregatedInference):
        resource = parse(resource)
    spec = resource.spec
    ctx = context(resource, options)
    objects: list[dict[str, Any]] = [engines.kv_config_map(ctx, spec)]
    serving = (options.serving_revision or ctx.revision) == ctx.revision
    for role in ROLES:
        canary = None if serving else options.canary_weight
        objects += [roles.headless_service(ctx, spec, role, serving=serving, canary_weight=canary),
                    *roles.workloads(ctx, spec, role)]
    if spec.router.enabled:  # the router reads the serving revision from the Services' label: no restart on a switch
        objects += [*router.rbac(ctx), router.deployment(ctx, spec), router.service(ctx, spec)]
    if spec.disruption.enabled:
        objects += [policy.pdb(ctx, spec, role) for role in ROLES]
    if spec.network.network_policy:
        objects.append(policy.network_policy(ctx, spec))
    objects += gateway.children(ctx, spec)  # the InferencePool and its Endpoint Picker, when enabled
    return sorted(objects, key=_sort_key)


__all__ = [
    "DEFAULT_IMAGE", "PlanOptions", "context", "image_of", "naming", "owner_reference", "plan", "revision_of",
]  # fmt: skip
