"""Table tests of the fleet plan: one row per example, plus the rules every plan keeps."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from pdfleet.operator.api import parse
from pdfleet.operator.plan import PlanOptions, owner_reference, plan, revision_of

ROOT = Path(__file__).resolve().parents[3]


def load(name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "examples" / f"{name}.yaml").read_text())


def by_kind(objs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objs if o["kind"] == kind]


def sts(objs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    (found,) = [o for o in by_kind(objs, "StatefulSet") if o["metadata"]["labels"]["pdfleet.io/role"] == role]
    return found


def engine_container(objs: list[dict[str, Any]], role: str) -> dict[str, Any]:
    return sts(objs, role)["spec"]["template"]["spec"]["containers"][0]


def arg(container: dict[str, Any], flag: str) -> str:
    args = container["args"]
    return args[args.index(flag) + 1]


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


# example, kinds expected, {role: (replicas, tp, gpus, rdma resource or None)}, network policy
# (on by default since the secure-by-default change: every example has one)
TABLE = [
    ("tiny-cpu", 13, {"prefill": (1, 1, None, None), "decode": (1, 1, None, None)}, True),
    ("gpu-rdma", 13, {"prefill": (2, 1, 1, "rdma/ib"), "decode": (2, 2, 2, "rdma/ib")}, True),
    ("hetero-tp", 13, {"prefill": (3, 1, 1, "rdma/hca_shared_devices_a"), "decode": (1, 4, 4, "rdma/hca_shared_devices_a")}, True),
]


@pytest.mark.parametrize("example,count,roles,netpol", TABLE, ids=[t[0] for t in TABLE])
def test_plan_table(example: str, count: int, roles: dict[str, tuple], netpol: bool) -> None:
    objs = plan(load(example))
    assert len(objs) == count
    assert bool(by_kind(objs, "NetworkPolicy")) == netpol
    for role, (replicas, tp, gpus, rdma) in roles.items():
        s = sts(objs, role)
        c = engine_container(objs, role)
        assert s["spec"]["replicas"] == replicas
        assert arg(c, "--tensor-parallel-size") == str(tp)
        limits = c.get("resources", {}).get("limits", {})
        assert limits.get("nvidia.com/gpu") == gpus
        assert limits.get(rdma) == (1 if rdma else None)
        caps = c.get("securityContext", {}).get("capabilities", {}).get("add", [])
        assert caps == (["IPC_LOCK"] if rdma else [])
        kv = json.loads(arg(c, "--kv-transfer-config"))
        assert kv["kv_connector"] == "PdfleetConnector"
        assert kv["kv_connector_module_path"] == "pdfleet.connector"
        assert kv["kv_role"] == {"prefill": "kv_producer", "decode": "kv_consumer"}[role]
        assert env(c)["VLLM_NIXL_SIDE_CHANNEL_HOST"] == {"fieldRef": {"fieldPath": "status.podIP"}}
        side_ports = [p["containerPort"] for p in c["ports"] if p["name"].startswith("nixl-side")]
        assert side_ports == [5600 + r for r in range(tp)]


def test_gpu_rdma_details() -> None:
    objs = plan(load("gpu-rdma"))
    decode = engine_container(objs, "decode")
    e = env(decode)
    assert e["UCX_NET_DEVICES"] == "mlx5_0:1"
    assert e["UCX_TLS"] == "rc,cuda_copy,cuda_ipc"
    assert e["HF_TOKEN"] == {"secretKeyRef": {"name": "hf-token", "key": "token"}}
    kv = json.loads(arg(decode, "--kv-transfer-config"))
    assert kv["kv_buffer_device"] == "cuda"
    assert kv["kv_connector_extra_config"]["auth_secret_file"] == "/var/run/secrets/pdfleet/side-channel-secret"
    template = sts(objs, "decode")["spec"]["template"]
    assert template["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "rdma-net"
    volumes = {v["name"]: v for v in template["spec"]["volumes"]}
    assert volumes["dshm"] == {"name": "dshm", "emptyDir": {"medium": "Memory"}}
    assert volumes["side-channel-secret"]["secret"]["secretName"] == "llama-8b-kv-auth"  # generated: no user Secret
    for svc in by_kind(objs, "Service"):
        if svc["metadata"]["labels"]["pdfleet.io/role"] in ("prefill", "decode"):
            assert svc["spec"]["clusterIP"] == "None"
            assert svc["spec"]["publishNotReadyAddresses"] is True
            assert {p["name"] for p in svc["spec"]["ports"]} >= {"http", "nixl-side"}
    pdbs = {p["metadata"]["name"]: p["spec"]["maxUnavailable"] for p in by_kind(objs, "PodDisruptionBudget")}
    assert pdbs == {"llama-8b-prefill": 1, "llama-8b-decode": "50%"}


def test_tiny_cpu_needs_no_gpu_nor_rdma() -> None:
    objs = plan(load("tiny-cpu"))
    for role in ("prefill", "decode"):
        c = engine_container(objs, role)
        assert "nvidia.com/gpu" not in c.get("resources", {}).get("limits", {})
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}  # no IPC_LOCK without RDMA
        assert arg(c, "--block-size") == "32"
        assert json.loads(arg(c, "--kv-transfer-config"))["kv_buffer_device"] == "cpu"
        assert env(c)["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_hetero_tp_mounts_the_claim() -> None:
    objs = plan(load("hetero-tp"))
    c = engine_container(objs, "decode")
    assert {"name": "model", "mountPath": "/models", "readOnly": True, "subPath": "Qwen2.5-32B-Instruct"} in c["volumeMounts"]
    assert c["args"][-2:] == ["--max-num-seqs", "256"]
    (router_svc,) = [s for s in by_kind(objs, "Service") if s["metadata"]["name"] == "qwen-hetero-router"]
    assert router_svc["spec"]["type"] == "LoadBalancer"


@pytest.mark.parametrize("version", ["1.30.0", "1.33.0"])
@pytest.mark.parametrize("example", ["tiny-cpu", "gpu-rdma", "hetero-tp"])
def test_every_child_validates_strictly(example: str, version: str) -> None:
    owner = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "name": "x", "uid": "u-1",
             "controller": True, "blockOwnerDeletion": True}  # fmt: skip
    for obj in plan(load(example), PlanOptions(owner=owner)):
        kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_catches_a_bad_child() -> None:
    """Negative control: the validator used above does refuse a broken object."""
    obj = copy.deepcopy(sts(plan(load("tiny-cpu")), "prefill"))
    obj["spec"]["template"]["spec"]["containers"][0]["portz"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(obj, "1.33.0", strict=True)


@pytest.mark.parametrize("example", ["tiny-cpu", "gpu-rdma", "hetero-tp"])
def test_selectors_match_their_pods(example: str) -> None:
    objs = plan(load(example))
    for obj in by_kind(objs, "StatefulSet") + by_kind(objs, "Deployment"):
        labels = obj["spec"]["template"]["metadata"]["labels"]
        assert obj["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pods = [o["spec"]["template"]["metadata"]["labels"] for o in by_kind(objs, "StatefulSet") + by_kind(objs, "Deployment")]
    for svc in by_kind(objs, "Service"):
        assert sum(svc["spec"]["selector"].items() <= p.items() for p in pods) == 1
    for pdb in by_kind(objs, "PodDisruptionBudget"):
        assert sum(pdb["spec"]["selector"]["matchLabels"].items() <= p.items() for p in pods) == 1


def test_plan_is_deterministic_and_namespaced() -> None:
    first = yaml.safe_dump_all(plan(load("gpu-rdma")))
    assert first == yaml.safe_dump_all(plan(load("gpu-rdma")))
    objs = plan(load("gpu-rdma"), PlanOptions(namespace="other"))
    assert {o["metadata"]["namespace"] for o in objs} == {"other"}
    assert {o["metadata"]["namespace"] for o in plan(load("tiny-cpu"))} == {"default"}


def test_owner_reference_on_every_child() -> None:
    cr = load("tiny-cpu")
    with pytest.raises(ValueError, match="uid"):
        owner_reference(cr)
    cr["metadata"]["uid"] = "1234"
    ref = owner_reference(cr)
    assert ref["controller"] is True and ref["uid"] == "1234"
    assert all(o["metadata"]["ownerReferences"] == [ref] for o in plan(cr, PlanOptions(owner=ref)))
    assert all("ownerReferences" not in o["metadata"] for o in plan(cr))


def _revision(cr: dict[str, Any]) -> str:
    return revision_of(parse(cr))


@pytest.mark.parametrize(
    "change,changes_revision",
    [
        (lambda s: s["prefill"].update(replicas=7), False),
        (lambda s: s["decode"].update(resources={"gpus": 0, "cpu": "4"}), False),
        (lambda s: s["router"].update(replicas=3) if "router" in s else s.update(router={"replicas": 3}), False),
        (lambda s: s["decode"].update(extraArgs=["--max-num-seqs", "8"]), False),
        (lambda s: s.update(image="example.org/pdfleet-runtime:9.9"), True),
        (lambda s: s["engine"].update(blockSize=64), True),
        (lambda s: s["kvTransfer"].update(leaseSeconds=99), True),
        (lambda s: s["model"].update(dtype="bfloat16"), True),
        (lambda s: s["engine"].update(extraArgs=["--kv-cache-dtype", "fp8"]), True),
    ],
)
def test_revision_tracks_what_prefill_and_decode_must_agree_on(change: Any, changes_revision: bool) -> None:
    cr = load("tiny-cpu")
    before = _revision(cr)
    change(cr["spec"])
    assert (_revision(cr) != before) == changes_revision


def test_revision_names_children_and_only_the_serving_revision_is_labelled_serving() -> None:
    cr = load("tiny-cpu")
    rev = _revision(cr)
    rolling = plan(cr, PlanOptions(serving_revision="oldrev1234"))
    assert sts(rolling, "prefill")["metadata"]["name"] == f"tiny-prefill-{rev}"
    assert sts(rolling, "decode")["spec"]["template"]["metadata"]["labels"]["pdfleet.io/revision"] == rev
    served = plan(cr, PlanOptions(serving_revision=rev))
    for objs, serving in ((rolling, None), (served, "true"), (plan(cr), "true")):
        services = [o for o in by_kind(objs, "Service") if o["metadata"]["labels"]["pdfleet.io/role"] != "router"]
        assert len(services) == 2
        assert all(s["metadata"]["labels"].get("pdfleet.io/serving") == serving for s in services)
    # The router is told nothing about revisions: its Deployment is the same whichever serves.
    (router_rolling,) = by_kind(rolling, "Deployment")
    (router_served,) = by_kind(served, "Deployment")
    assert router_rolling == router_served
    assert "--revision" not in router_served["spec"]["template"]["spec"]["containers"][0]["args"]


def test_optional_children_follow_the_spec() -> None:
    cr = load("gpu-rdma")
    cr["spec"]["router"]["enabled"] = False
    cr["spec"]["disruption"] = {"enabled": False}
    cr["spec"]["network"]["networkPolicy"] = False
    kinds = {o["kind"] for o in plan(cr)}
    assert kinds == {"ConfigMap", "Service", "StatefulSet"}


def test_router_pod_is_restricted() -> None:
    (router,) = by_kind(plan(load("tiny-cpu")), "Deployment")
    sc = router["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and not sc["allowPrivilegeEscalation"]
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc["seccompProfile"] == {"type": "RuntimeDefault"}


def test_secure_by_default_mounts_the_generated_secret_and_never_carries_a_key() -> None:
    """No authSecretRef: engines mount <fleet>-kv-auth and sign; the plan holds no Secret and no key."""
    resource = load("tiny-cpu")
    assert "authSecretRef" not in resource["spec"].get("kvTransfer", {})
    objs = plan(resource)
    assert not by_kind(objs, "Secret")
    for role in ("prefill", "decode"):
        template = sts(objs, role)["spec"]["template"]
        volumes = {v["name"]: v for v in template["spec"]["volumes"]}
        assert volumes["side-channel-secret"]["secret"]["secretName"] == "tiny-kv-auth"
        assert volumes["side-channel-secret"]["secret"]["items"] == [{"key": "key", "path": "side-channel-secret"}]
        kv = json.loads(arg(engine_container(objs, role), "--kv-transfer-config"))
        assert kv["kv_connector_extra_config"]["auth_secret_file"] == "/var/run/secrets/pdfleet/side-channel-secret"
        assert "allow_unauthenticated" not in kv["kv_connector_extra_config"]
    # Opt-out of the network policy is explicit.
    off = copy.deepcopy(resource)
    off["spec"].setdefault("network", {})["networkPolicy"] = False
    assert not by_kind(plan(off), "NetworkPolicy") and by_kind(objs, "NetworkPolicy")


@pytest.mark.parametrize("lease, prefill_grace, prefill_drain", [
    (30, 60, 45), (120, 150, 135), (3600, 600, 585), (1, 31, 16),
])
def test_engines_drain_on_sigterm_within_their_grace_period(lease, prefill_grace, prefill_drain) -> None:
    """Prefill drains one lease (+ margin) before vLLM aborts anything; decode finishes its streams;
    the kubelet's SIGKILL (grace period) always comes after vLLM's drain ends."""
    resource = load("tiny-cpu")
    resource["spec"]["kvTransfer"]["leaseSeconds"] = lease
    objs = plan(resource)
    for role, grace, drain in (("prefill", prefill_grace, prefill_drain), ("decode", 615, 600)):
        pod = sts(objs, role)["spec"]["template"]["spec"]
        assert pod["terminationGracePeriodSeconds"] == grace
        assert arg(engine_container(objs, role), "--shutdown-timeout") == str(drain)
        assert drain < grace
    assert prefill_drain >= min(lease, 585)
