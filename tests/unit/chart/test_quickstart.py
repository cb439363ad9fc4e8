"""docs/quickstart.md's objects, offline (issue 39 part 1): the chart as the quickstart installs it and the
fleet it applies, rendered and validated strictly for Kubernetes 1.30 and 1.37; the fleet needs nothing a bare
cluster lacks (no GPU, no RDMA, no Secret of the user's); and docs/quickstart.sh, the same steps as one script
(tests/k8s/test_quickstart_k8s.py runs it on a cluster), names what the plan renders."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from chart_render import CHART, env_value, one, operator_container, render_docs
from pdfleet.operator.api import parse
from pdfleet.operator.plan import PlanOptions, plan

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "examples" / "quickstart-cpu.yaml"
SCRIPT = (REPO / "docs" / "quickstart.sh").read_text()
DOC = (REPO / "docs" / "quickstart.md").read_text()
KUBE = ["1.30.0", "1.37.0"]
REGISTRY = "registry.example.com/me"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
OWNER = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "name": "quickstart", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}
# what the quickstart passes to helm (docs/quickstart.md step 2, quickstart.sh)
VALUES = {"image": {"repository": f"{REGISTRY}/pdfleet-operator"},
          "runtimeImage": {"repository": f"{REGISTRY}/pdfleet-runtime-cpu"}}


def fleet(path: Path = EXAMPLE) -> list[dict[str, Any]]:
    options = PlanOptions(owner=OWNER, default_image=f"{REGISTRY}/pdfleet-runtime-cpu:{APP_VERSION}")
    return plan(parse(yaml.safe_load(path.read_text())), options)


@pytest.mark.parametrize("kube", KUBE)
def test_the_fleet_validates_strictly(kube) -> None:
    objs = fleet()
    assert {o["kind"] for o in objs} >= {"StatefulSet", "Deployment", "Service", "NetworkPolicy"}
    for obj in objs:
        kubernetes_validate.validate(obj, kube, strict=True)


@pytest.mark.parametrize("kube", KUBE)
def test_the_chart_as_the_quickstart_installs_it_validates_strictly(kube) -> None:
    docs = render_docs(VALUES)
    for doc in docs:
        if doc["apiVersion"] not in ("monitoring.coreos.com/v1", "kopf.dev/v1"):
            kubernetes_validate.validate(doc, kube, strict=True)
    container = operator_container(docs)
    assert container["image"] == f"{REGISTRY}/pdfleet-operator:{APP_VERSION}"  # what `make images` tags
    assert env_value(container, "PDFLEET_DEFAULT_IMAGE") == f"{REGISTRY}/pdfleet-runtime-cpu:{APP_VERSION}"
    assert one(docs, "Deployment")["metadata"]["namespace"] == "pdfleet-system"


def bare_cluster_problems(objs: list[dict[str, Any]], generated: set[str]) -> list[str]:
    """What a cluster without GPUs, RDMA or the user's Secrets could not run: extended resources, and Secrets
    that are not among those the operator generates."""
    problems = []
    for obj in objs:
        pod = obj.get("spec", {}).get("template", {}).get("spec")
        if not pod:
            continue
        for c in pod["containers"]:
            extended = [r for r in c.get("resources", {}).get("limits", {}) if "/" in r]
            problems += [f"{obj['metadata']['name']}: {r}" for r in extended]
            refs = [e["valueFrom"]["secretKeyRef"]["name"] for e in c.get("env", [])
                    if "secretKeyRef" in e.get("valueFrom", {})]
            problems += [f"{obj['metadata']['name']}: Secret {s}" for s in refs if s not in generated]
        problems += [f"{obj['metadata']['name']}: Secret {v['secret']['secretName']}" for v in pod.get("volumes", [])
                     if "secret" in v and v["secret"]["secretName"] not in generated]
    return problems


GENERATED = {"quickstart-kv-auth", "quickstart-engine-api"}  # the operator makes these (plan/auth.py)


def test_the_fleet_needs_nothing_a_bare_cluster_lacks() -> None:
    assert bare_cluster_problems(fleet(), GENERATED) == []


def test_the_check_sees_what_a_gpu_fleet_needs() -> None:
    """Negative control: examples/gpu-rdma.yaml needs GPUs, RDMA and the hf-token Secret, and the check says so."""
    problems = bare_cluster_problems(fleet(REPO / "examples" / "gpu-rdma.yaml"), {"llama-8b-kv-auth",
                                                                                   "llama-8b-engine-api"})
    assert any("nvidia.com/gpu" in p for p in problems) and any("rdma/ib" in p for p in problems)
    assert any("Secret hf-token" in p for p in problems)


def _script_var(name: str) -> str:
    (value,) = re.findall(rf"^{name}=(\S+)", SCRIPT, re.M)
    return value


def test_the_script_and_the_doc_name_what_the_plan_renders() -> None:
    cr = yaml.safe_load(EXAMPLE.read_text())
    spec = parse(cr).spec
    namespace, name = cr["metadata"]["namespace"], cr["metadata"]["name"]
    assert (_script_var("NAMESPACE"), _script_var("FLEET"), _script_var("MODEL")) == (
        namespace, name, spec.model.served_model_name or spec.model.name)
    router = [o for o in fleet() if o["kind"] == "Service" and o["metadata"]["name"] == f"{name}-router"]
    assert router and router[0]["spec"]["ports"][0]["port"] == spec.router.port == 8000
    assert _script_var("ROUTER_SERVICE") == "$FLEET-router"
    assert '"$LOCAL_PORT:8000"' in SCRIPT
    for text in (f"svc/{name}-router 8000:8000", f"wait --for=condition=Ready dinf/{name}", f"-n {namespace}",
                 spec.model.name, "runtimeImage.repository=$REGISTRY/pdfleet-runtime-cpu", "/v1/completions"):
        assert text in DOC, text


def test_the_script_parses() -> None:
    subprocess.run(["bash", "-n", str(REPO / "docs" / "quickstart.sh")], check=True)


def test_the_readme_sends_a_new_user_to_the_quickstart_first() -> None:
    readme = (REPO / "README.md").read_text()
    assert readme.index("docs/quickstart.md") < readme.index("## Install")
    assert "helm template charts/pdfleet |" not in readme  # the operator landed in `default`
