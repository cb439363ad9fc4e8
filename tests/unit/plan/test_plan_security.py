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

ROOT = Path(__file__).resolve().parents[3]
OWNER = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "name": "x", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}
ALLOWED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected",
                   "secret"}


def restricted_violations(pod: dict[str, Any]) -> set[str]:
    """The Pod Security Standards "restricted" checks (kubernetes.io/docs/concepts/security/pod-security-standards),
    for a pod spec: one name per check failed."""
    out = set()
    psc = pod.get("securityContext") or {}
    if pod.get("hostNetwork") or pod.get("hostPID") or pod.get("hostIPC"):
        out.add("hostNamespaces")
    for v in pod.get("volumes") or ():
        if not set(v) - {"name"} <= ALLOWED_VOLUMES:
            out.add("volumeTypes")
    for c in (pod.get("initContainers") or []) + pod["containers"]:
        sc = c.get("securityContext") or {}
        if sc.get("privileged"):
            out.add("privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.add("allowPrivilegeEscalation")
        caps = sc.get("capabilities") or {}
        if "ALL" not in (caps.get("drop") or ()):
            out.add("capabilities.drop")
        if set(caps.get("add") or ()) - {"NET_BIND_SERVICE"}:
            out.add("capabilities.add")
        if sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is not True:
            out.add("runAsNonRoot")
        if sc.get("runAsUser", psc.get("runAsUser")) == 0:
            out.add("runAsUser")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.add("seccompProfile")
        if any(p.get("hostPort") for p in c.get("ports") or ()):
            out.add("hostPorts")
    return out


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
    assert restricted_violations(by_role["router"]) == set()
    for role in ("prefill", "decode"):
        assert restricted_violations(by_role[role]) == engine_exceptions, role
        for c in (by_role[role].get("initContainers") or []) + by_role[role]["containers"]:
            assert set(c["securityContext"]["capabilities"].get("add") or ()) <= {"IPC_LOCK"}


def test_the_check_catches_what_main_shipped():
    """Negative control: main's engine container (capabilities add IPC_LOCK, nothing else) fails five checks."""
    pod = {"containers": [{"name": "vllm", "securityContext": {"capabilities": {"add": ["IPC_LOCK"]}}}]}
    assert restricted_violations(pod) == {"allowPrivilegeEscalation", "capabilities.drop", "capabilities.add",
                                          "runAsNonRoot", "seccompProfile"}


@pytest.mark.parametrize("example", ["tiny-cpu", "gpu-rdma", "hetero-tp"])
def test_hardened_children_validate_strictly(example):
    for obj in plan(parse(yaml.safe_load((ROOT / "examples" / f"{example}.yaml").read_text())),
                    PlanOptions(owner=OWNER)):
        kubernetes_validate.validate(obj, "1.33.0", strict=True)
