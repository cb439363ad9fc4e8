"""The router and the Endpoint Picker load the model's tokenizer as the engines load the model (issue 39 part 3):
the model's token Secret, a writable HF_HOME under their read-only root, the PVC read-only at the engines' path.
Table-tested over model sources; every Deployment validated strictly (Kubernetes 1.30 and 1.37) and held to Pod
Security "restricted"."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pod_security import violated_controls  # noqa: E402
from pdfleet.operator.api import parse  # noqa: E402
from pdfleet.operator.plan import PlanOptions, plan  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
OWNER = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "name": "tiny", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}
TOKEN = {"name": "hf-token", "key": "token"}
GATED = {"name": "meta-llama/Llama-3.1-8B-Instruct", "source": {"hf": {"tokenSecretRef": TOKEN}}}
PVC = {"name": "/models/qwen", "source": {"pvc": {"claimName": "weights", "subPath": "qwen-32b"}}}
PUBLIC = {"name": "Qwen/Qwen2.5-0.5B-Instruct"}
FRONT_ENDS = ("router", "epp")


def pods(model: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Pod spec per role (prefill, decode, router, epp) of tiny-cpu with this model, behind a Gateway."""
    cr = yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())
    cr["spec"]["model"] = {**copy.deepcopy(model), "maxModelLen": 4096, "dtype": "float32"}
    cr["spec"]["gateway"] = {"inferencePool": {"enabled": True, "allowFrom": [{"namespaceSelector": {}}]}}
    out = {}
    for obj in plan(parse(cr), PlanOptions(owner=OWNER)):
        if obj["kind"] in ("StatefulSet", "Deployment"):
            for version in ("1.30.0", "1.37.0"):
                kubernetes_validate.validate(obj, version, strict=True)
            out[obj["metadata"]["labels"]["pdfleet.io/role"]] = obj["spec"]["template"]["spec"]
    return out


def env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["containers"][0]["env"]}


def mounts(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["mountPath"]: m for m in pod["containers"][0].get("volumeMounts", [])}


def volume(pod: dict[str, Any], name: str) -> dict[str, Any]:
    (found,) = [v for v in pod["volumes"] if v["name"] == name]
    return found


def writable_hf_home(pod: dict[str, Any]) -> bool:
    """HF_HOME is a mounted, writable emptyDir (the root filesystem is read-only)."""
    home = env(pod).get("HF_HOME")
    mount = mounts(pod).get(home)
    return (mount is not None and not mount.get("readOnly") and "emptyDir" in volume(pod, mount["name"])
            and pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"])


# model, HF_TOKEN expected from, the model's mount expected on the front ends
CASES = [
    ("gated", GATED, {"secretKeyRef": TOKEN}, None),
    ("pvc", PVC, None, {"mountPath": "/models", "readOnly": True, "subPath": "qwen-32b"}),
    ("public", PUBLIC, None, None),
]


@pytest.mark.parametrize("case,model,token,model_mount", CASES, ids=[c[0] for c in CASES])
def test_front_ends_load_the_tokenizer_as_the_engines_load_the_model(case, model, token, model_mount) -> None:
    by_role = pods(model)
    for role in FRONT_ENDS:
        pod = by_role[role]
        assert writable_hf_home(pod), role
        assert env(pod).get("HF_TOKEN") == token, role
        found = mounts(pod).get("/models")
        assert (found and {k: found[k] for k in model_mount}) == (model_mount or None), role
        if model_mount:  # the engines' own claim, mount and path: the tokenizer is where --tokenizer points
            assert found == mounts(by_role["decode"])["/models"]
            assert volume(pod, found["name"]) == volume(by_role["decode"], found["name"])
            assert volume(pod, found["name"])["persistentVolumeClaim"]["readOnly"] is True
        if token:
            assert env(pod)["HF_TOKEN"] == env(by_role["prefill"])["HF_TOKEN"]
        assert violated_controls(pod) == set(), role  # still "restricted"


def test_the_check_catches_a_front_end_without_the_cache() -> None:
    """Negative control: the router as it was (no HF_HOME, no volume) fails the check."""
    pod = copy.deepcopy(pods(GATED)["router"])
    pod["containers"][0]["env"] = [e for e in pod["containers"][0]["env"] if e["name"] not in ("HF_HOME", "HF_TOKEN")]
    pod["containers"][0].pop("volumeMounts")
    pod.pop("volumes")
    assert not writable_hf_home(pod)
    assert env(pod).get("HF_TOKEN") is None
