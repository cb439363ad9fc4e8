"""The operator's view of the fleet plan (pure): desired children, revision, ports, URL."""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional

from pdfleet.operator.plan.kinds import ENGINE_WORKLOAD_KINDS, STATEFULSET
from pdfleet.contract import labels as label_keys
from pdfleet.operator.api import DisaggregatedInference
from pdfleet.operator.plan import PlanOptions, plan, revision_of
from pdfleet.operator.plan.engines import HTTP_PORT_NAME, KV_EVENTS_PORT_NAME, SIDE_CHANNEL_PORT_NAME
from pdfleet.operator.kube.observed import ObservedChild


def target_revision(cr: DisaggregatedInference, image: str) -> str:
    return revision_of(cr, PlanOptions(default_image=image))


def desired_children(cr: DisaggregatedInference, *, owner: Mapping[str, Any], image: str,
                     router_revision: Optional[str], canary_weight: Optional[int] = None) -> list[dict[str, Any]]:
    options = PlanOptions(default_image=image, owner=dict(owner), serving_revision=router_revision,
                          canary_weight=canary_weight)
    return plan(cr, options)


def revision_ports(children: Iterable[ObservedChild], cr: DisaggregatedInference) -> dict[str, tuple[int, int]]:
    """revision -> (sideChannelPort, httpPort), read from each prefill StatefulSet's pod template,
    so that the endpoints of an older revision keep that revision's ports."""
    out: dict[str, tuple[int, int]] = {}
    for c in children:
        if c.ref.kind not in ENGINE_WORKLOAD_KINDS or c.role != "prefill" or not c.revision:
            continue
        ports = dict(c.ports)
        side = ports.get(SIDE_CHANNEL_PORT_NAME, cr.spec.kv_transfer.side_channel_port)
        http = ports.get(HTTP_PORT_NAME, cr.spec.engine.port)
        out[c.revision] = (side, http)
    return out


def revision_kv_events_ports(children: Iterable[ObservedChild]) -> dict[str, int]:
    """revision -> the engines' KV event port, read from each prefill StatefulSet's pod template."""
    out: dict[str, int] = {}
    for c in children:
        if c.ref.kind == STATEFULSET.kind and c.role == "prefill" and c.revision:
            port = dict(c.ports).get(KV_EVENTS_PORT_NAME)
            if port is not None:
                out[c.revision] = port
    return out


def router_url(desired: Iterable[Mapping[str, Any]], cr: DisaggregatedInference) -> Optional[str]:
    """In-cluster URL of the router Service, when the plan has one."""
    for obj in desired:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        if obj.get("kind") == "Service" and labels.get(label_keys.ROLE) == label_keys.ROLE_ROUTER:
            meta = obj["metadata"]
            port = (obj.get("spec") or {}).get("ports", [{}])[0].get("port", cr.spec.router.port)
            return f"http://{meta['name']}.{meta['namespace']}.svc:{port}"
    return None
