"""Which EndpointSlices the router may send traffic to (pure).

Labels alone prove nothing: anyone who may create an EndpointSlice in the
namespace can copy the fleet's labels. The router therefore uses a slice only
when it is one the EndpointSlice controller keeps for a Service that the
fleet's DisaggregatedInference controls:

1. the Service carries a controller ownerReference to the fleet (kind
   DisaggregatedInference, group pdfleet.io, the fleet's name, and its uid when
   the router was told it). Kubernetes' garbage collector deletes an object
   whose owner uid does not exist, so a made-up reference does not last;
2. the slice carries ``endpointslice.kubernetes.io/managed-by:
   endpointslice-controller.k8s.io`` and ``kubernetes.io/service-name`` naming
   such a Service, and a controller ownerReference to that Service by name and
   uid. The EndpointSlice controller deletes slices carrying its label that the
   Service does not own, and rewrites those it owns to the pods the Service
   selects, so a forged slice does not last either, and a slice of a Service
   that was deleted and made again by someone else (new uid) is refused.

What is left (someone who may update the fleet's own Services, or who forges a
slice the controller has not yet corrected) is a matter of RBAC; see
docs/router.md.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# Values Kubernetes sets (discovery.k8s.io/v1); one place until pdfleet.contract lands.
MANAGED_BY_LABEL = "endpointslice.kubernetes.io/managed-by"
SLICE_CONTROLLER = "endpointslice-controller.k8s.io"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"
FLEET_KIND = "DisaggregatedInference"
FLEET_GROUP = "pdfleet.io"


def _controller_ref(meta: Mapping[str, Any]) -> Mapping[str, Any] | None:
    refs = meta.get("ownerReferences")
    if not isinstance(refs, list):
        return None
    for ref in refs:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def service_owner_problem(service: Mapping[str, Any], fleet: str, fleet_uid: str | None = None) -> str | None:
    """None when the fleet controls this Service, else why not."""
    meta = service.get("metadata") if isinstance(service.get("metadata"), Mapping) else {}
    ref = _controller_ref(meta)
    if ref is None:
        return "no controller ownerReference"
    api_version = ref.get("apiVersion")
    if (ref.get("kind") != FLEET_KIND or not isinstance(api_version, str)
            or api_version.split("/", 1)[0] != FLEET_GROUP or ref.get("name") != fleet):
        return f"controlled by {ref.get('kind')}/{ref.get('name')}, not {FLEET_KIND}/{fleet}"
    if fleet_uid and ref.get("uid") != fleet_uid:
        return f"owner uid {ref.get('uid')!r} is not the fleet's"
    if not meta.get("uid"):
        return "no metadata.uid"
    return None


def owned_services(services: Iterable[Mapping[str, Any]], fleet: str,
                   fleet_uid: str | None = None) -> dict[str, str]:
    """Name -> uid of the Services the fleet controls."""
    owned = {}
    for svc in services:
        if not isinstance(svc, Mapping) or service_owner_problem(svc, fleet, fleet_uid) is not None:
            continue
        meta = svc["metadata"]
        if isinstance(meta.get("name"), str):
            owned[meta["name"]] = meta["uid"]
    return owned


def slice_owner_problem(obj: Mapping[str, Any], services: Mapping[str, str]) -> str | None:
    """None when the slice is the EndpointSlice controller's, for a Service in ``services``
    (name -> uid); else why the router does not use it."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    if labels.get(MANAGED_BY_LABEL) != SLICE_CONTROLLER:
        return f"label {MANAGED_BY_LABEL} is {labels.get(MANAGED_BY_LABEL)!r}, not {SLICE_CONTROLLER!r}"
    service = labels.get(SERVICE_NAME_LABEL)
    if service not in services:
        return f"label {SERVICE_NAME_LABEL}={service!r} names no Service of the fleet"
    ref = _controller_ref(meta)
    if ref is None or ref.get("kind") != "Service" or ref.get("apiVersion") != "v1" or ref.get("name") != service:
        return f"not controlled by Service {service}"
    if ref.get("uid") != services[service]:
        return f"controlled by another Service {service} (uid {ref.get('uid')!r})"
    return None


def owned_slices(slices: Iterable[Mapping[str, Any]],
                 services: Mapping[str, str]) -> tuple[list[Mapping[str, Any]], list[tuple[str, str]]]:
    """(slices the router may use, [(name, reason)] of those it refuses)."""
    kept, refused = [], []
    for obj in slices:
        problem = slice_owner_problem(obj, services)
        if problem is None:
            kept.append(obj)
        else:
            meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
            refused.append((str(meta.get("name")), problem))
    return kept, refused


def needs_service_refresh(obj: Mapping[str, Any], services: Mapping[str, str]) -> bool:
    """A controller-managed slice for a Service name or uid the router has not seen
    (a new revision's Service, or one made again): list the Services again."""
    meta = obj.get("metadata") if isinstance(obj.get("metadata"), Mapping) else {}
    labels = meta.get("labels") if isinstance(meta.get("labels"), Mapping) else {}
    if labels.get(MANAGED_BY_LABEL) != SLICE_CONTROLLER:
        return False
    service = labels.get(SERVICE_NAME_LABEL)
    if not isinstance(service, str):
        return False
    ref = _controller_ref(meta)
    return service not in services or (ref is not None and ref.get("uid") != services[service])
