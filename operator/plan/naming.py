"""Names, labels and the revision hash of a fleet's children (pure)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pdfleet.contract import labels
from pdfleet.operator.api.types import DisaggregatedInferenceSpec

FLEET_LABEL = labels.FLEET
ROLE_LABEL = labels.ROLE
REVISION_LABEL = labels.REVISION
GROUP_LABEL = labels.GROUP
ROUTER = labels.ROLE_ROUTER
REVISION_LENGTH = 10


def fleet_labels(fleet: str) -> dict[str, str]:
    """Labels on every child: enough to find all of a fleet's objects."""
    return {
        "app.kubernetes.io/name": "pdfleet",
        "app.kubernetes.io/instance": fleet,
        "app.kubernetes.io/part-of": "pdfleet",
        "app.kubernetes.io/managed-by": "pdfleet-operator",
        FLEET_LABEL: fleet,
    }


def role_labels(fleet: str, role: str) -> dict[str, str]:
    return {**fleet_labels(fleet), "app.kubernetes.io/component": role, ROLE_LABEL: role}


def revision_labels(fleet: str, role: str, revision: str) -> dict[str, str]:
    return {**role_labels(fleet, role), REVISION_LABEL: revision}


def revision_only_labels(fleet: str, revision: str) -> dict[str, str]:
    """A revision's objects that belong to no one role (its ConfigMap)."""
    return {**fleet_labels(fleet), REVISION_LABEL: revision}


def selector(fleet: str, role: str, revision: str | None = None) -> dict[str, str]:
    """The small, immutable subset used in selectors."""
    sel = {FLEET_LABEL: fleet, ROLE_LABEL: role}
    return {**sel, REVISION_LABEL: revision} if revision else sel


def role_workload_name(fleet: str, role: str, revision: str) -> str:
    """StatefulSet and headless Service of one role at one revision."""
    return f"{fleet}-{role}-{revision}"


def router_name(fleet: str) -> str:
    return f"{fleet}-router"


def kv_config_name(fleet: str, revision: str) -> str:
    return f"{fleet}-kv-{revision}"


def revision_inputs(spec: DisaggregatedInferenceSpec, image: str) -> dict[str, Any]:
    """Everything prefill and decode must agree on to exchange KV blocks.

    Replicas, resources and placement are left out on purpose: scaling or
    moving pods must not start a paired rollout.
    """
    inputs: dict[str, Any] = {
        "image": image,
        "model": spec.model.model_dump(mode="json", by_alias=True, exclude_none=True),
        "blockSize": spec.engine.block_size,
        "engineExtraArgs": list(spec.engine.extra_args),
        "kvTransfer": spec.kv_transfer.model_dump(mode="json", by_alias=True, exclude_none=True),
        # Side channel v2, always signed: engines from before it never pair with these.
        "sideChannel": "signed-v2",
    }
    # A role that spans several pods is another kind of workload (LeaderWorkerSet): a new
    # revision comes up beside the old one. Absent when 1, so single-node revisions stay as they were.
    nodes = {r: spec.role(r).nodes_per_replica for r in ("prefill", "decode") if spec.role(r).nodes_per_replica != 1}
    if nodes:
        inputs["nodesPerReplica"] = nodes
    return inputs


def revision(spec: DisaggregatedInferenceSpec, image: str) -> str:
    canonical = json.dumps(revision_inputs(spec, image), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()[:REVISION_LENGTH]
