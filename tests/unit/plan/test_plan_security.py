"""Pods against Pod Security "restricted" (issue 20 row 8): the router meets it whole, the engines all
of it but what vLLM's image and RDMA need (named here, and in plan/engines.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pdfleet.operator.api import parse
from pdfleet.operator.plan import PlanOptions, plan
from pod_security import violated_controls

ROOT = Path(__file__).resolve().parents[3]
OWNER = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "name": "x", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}


def pods(example: str) -> dict[str, dict[str, Any]]:
    objs = plan(parse(yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())), PlanOptions(owner=OWNER))
    out = {}
    for o in objs:
        if o["kind"] in ("StatefulSet", "Deployment"):
            out[o["metadata"]["labels"]["pdfleet.io/role"]] = o["spec"]["template"]["spec"]
        elif o["kind"] == "LeaderWorkerSet":
            out[o["metadata"]["labels"]["pdfleet.io/role"]] = o["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]
    return out


@pytest.mark.parametrize("example, engine_exceptions", [
    ("tiny-cpu", {"runAsNonRoot"}),  # the vLLM image runs as root
    ("gpu-rdma", {"runAsNonRoot", "capabilities.add"}),  # + IPC_LOCK: RDMA pins memory
    ("hetero-tp", {"runAsNonRoot", "capabilities.add"}),
])
def test_pods_are_restricted_but_for_what_the_engines_need(example, engine_exceptions):
    by_role = pods(example)
    assert violated_controls(by_role["router"]) == set()
    for role in ("prefill", "decode"):
        assert violated_controls(by_role[role]) == engine_exceptions, role
        for c in (by_role[role].get("initContainers") or []) + by_role[role]["containers"]:
            assert set(c["securityContext"]["capabilities"].get("add") or ()) <= {"IPC_LOCK"}


def test_the_check_catches_what_main_shipped():
    """Negative control: main's engine container (capabilities add IPC_LOCK, nothing else) fails five checks."""
    pod = {"containers": [{"name": "vllm", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}]}
    assert violated_controls(pod) == {"allowPrivilegeEscalation", "capabilities.drop", "capabilities.add",
                                          "runAsNonRoot", "seccompProfile"}


@pytest.mark.parametrize("example", ["tiny-cpu", "gpu-rdma", "hetero-tp"])
def test_hardened_children_validate_strictly(example):
    for obj in plan(parse(yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())),
                    PlanOptions(owner=OWNER)):
        kubernetes_validate.validate(obj, "1.33.0", strict=True)
