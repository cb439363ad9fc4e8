"""Multi-node roles on the API fixture: the real kopf operator creates and owns LeaderWorkerSets,
reports status from them like StatefulSets, rolls them out in pairs, creates gang PodGroups only
for enabled providers, and shows the fabric preflight as the KVTransport condition."""

from __future__ import annotations

import json

import pytest
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import eventually
from operator_scenarios import (
    KIND_RESOURCES,
    condition,
    expected_children,
    fleet,
    fleet_children,
    make_fleet_ready,
    names_by_kind,
    settle,
    wait_children,
    wait_status,
)

pytestmark = pytest.mark.timeout(60)
LWS = KIND_RESOURCES["LeaderWorkerSet"]
PG = KIND_RESOURCES["PodGroup"]


def big(**spec) -> dict:
    return fleet(prefill={"replicas": 1, "tensorParallelSize": 2, "nodesPerReplica": 2},
                 decode={"replicas": 2, "tensorParallelSize": 4, "nodesPerReplica": 2}, **spec)


async def test_leaderworkersets_are_created_owned_and_report_status(driver: FakeDriver, kube):
    cr = await driver.create_cr(big())
    want = names_by_kind(expected_children(cr, NAMESPACE))
    assert "StatefulSet" not in want and len(want["LeaderWorkerSet"]) == 2
    await wait_children(driver, "llama", want)
    for lws in await driver.list(LWS, {"pdfleet.io/fleet": "llama"}):
        refs = lws["metadata"]["ownerReferences"]
        assert [r["uid"] for r in refs if r.get("controller")] == [cr["metadata"]["uid"]]
    st = await wait_status(driver, "llama", lambda s: s.get("revision"), "revision")
    rev = st["revision"]
    assert condition(st, "Ready")["status"] == "False"

    await make_fleet_ready(driver, "llama")
    st = await wait_status(driver, "llama", lambda s: condition(s, "Ready")["status"] == "True", "Ready=True")
    assert st["decode"]["readyReplicas"] == 2 and st["prefill"]["readyReplicas"] == 1
    # The endpoint is the leader pod (worker-index 0), never a worker.
    (endpoint,) = st["endpoints"]["prefill"]
    leader = await driver.get("v1/pods", f"llama-prefill-{rev}-0")
    assert endpoint["pod"] == f"llama-prefill-{rev}-0" and endpoint["ip"] == leader["status"]["podIP"]
    assert await driver.get("v1/pods", f"llama-prefill-{rev}-0-1") is not None, "the worker pod exists"
    await wait_status(driver, "llama", lambda s: condition(s, "Progressing")["status"] == "False", "settled")

    # One group of decode stops being ready: status follows the LeaderWorkerSet.
    await kube.simulate_leaderworkerset(NAMESPACE, f"llama-decode-{rev}", ready=1)
    st = await wait_status(driver, "llama", lambda s: s["decode"]["readyReplicas"] == 1, "decode 1 ready")
    assert condition(st, "Ready")["status"] == "True" and condition(st, "Progressing")["status"] == "True"


async def ready_then_new_image(driver: FakeDriver) -> str:
    """A multi-node fleet made ready, then given a new image: the revision it served."""
    await driver.create_cr(big())
    st = await wait_status(driver, "llama", lambda s: s.get("revision"), "revision")
    await make_fleet_ready(driver, "llama")
    await wait_status(driver, "llama", lambda s: condition(s, "Ready")["status"] == "True", "Ready")
    await driver.patch_cr("llama", {"spec": {"image": "registry.example/pdfleet-runtime:v2"}})
    return st["revision"]


async def test_paired_rollout_of_leaderworkersets(driver: FakeDriver):
    old = await ready_then_new_image(driver)
    st = await wait_status(driver, "llama", lambda s: condition(s, "Progressing")["reason"] == "RollingOut",
                           "rolling out")
    new = st["rollout"]["targetRevision"]
    assert new != old and st["revision"] == old, "the router stays on the old pair until the new one is ready"
    names = (await fleet_children(driver, "llama"))["LeaderWorkerSet"]
    assert names == {f"llama-{r}-{v}" for r in ("prefill", "decode") for v in (old, new)}
    await driver.make_ready("Deployment", "llama-router")  # the router rolls out the new image too
    await driver.make_ready("LeaderWorkerSet", f"llama-prefill-{new}")
    await driver.make_ready("LeaderWorkerSet", f"llama-decode-{new}")
    st = await wait_status(driver, "llama", lambda s: s["revision"] == new, "switched")
    assert {e["revision"] for e in st["endpoints"]["prefill"]} <= {new}
    for _ in range(200):
        if (await fleet_children(driver, "llama"))["LeaderWorkerSet"] == {f"llama-prefill-{new}", f"llama-decode-{new}"}:
            break
        import asyncio
        await asyncio.sleep(0.05)
    assert (await fleet_children(driver, "llama"))["LeaderWorkerSet"] == {f"llama-prefill-{new}", f"llama-decode-{new}"}


TCP = {"type": "KVTransport", "status": "False", "reason": "TCPFallback", "transport": "tcp/eth0", "gBps": 0.4,
       "message": "RDMA was asked for (UCX_TLS=rc) but UCX moved the READ over tcp/eth0 at 0.40 GB/s"}
RDMA = {"type": "KVTransport", "status": "True", "reason": "TransportVerified", "transport": "rc_mlx5/mlx5_0:1",
        "gBps": 21.5, "message": "loopback READ of 8 MiB over rc_mlx5/mlx5_0:1 at 21.50 GB/s"}


async def test_kv_transport_condition_and_degraded_on_tcp_fallback(driver: FakeDriver, kube):
    await driver.create_cr(big(network={"ucxTransports": ["rc"], "preflight": {"minGBps": 10}}))
    st = await wait_status(driver, "llama", lambda s: s.get("revision"), "revision")
    rev = st["revision"]
    assert condition(st, "KVTransport")["status"] == "Unknown"
    for role in ("prefill", "decode"):
        await kube.simulate_leaderworkerset(NAMESPACE, f"llama-{role}-{rev}", init_message=json.dumps(RDMA))
    await driver.make_ready("Deployment", "llama-router")
    st = await wait_status(driver, "llama", lambda s: condition(s, "KVTransport")["status"] == "True"
                           and condition(s, "Ready")["status"] == "True", "KVTransport")
    assert condition(st, "Ready")["status"] == "True"
    assert st["decode"]["kvTransport"] == {"status": "True", "reason": "TransportVerified", "transport":
                                           "rc_mlx5/mlx5_0:1", "gBps": 21.5, "message": st["decode"]["kvTransport"]["message"]}
    assert "21.50 GB/s" in condition(st, "KVTransport")["message"]

    # The decode pods come back over TCP: not Ready, Degraded, the reason and UCX's words shown.
    await kube.simulate_leaderworkerset(NAMESPACE, f"llama-decode-{rev}", init_message=json.dumps(TCP))
    st = await wait_status(driver, "llama", lambda s: condition(s, "KVTransport")["status"] == "False", "TCP")
    kv = condition(st, "KVTransport")
    assert kv["reason"] == "TCPFallback" and "tcp/eth0" in kv["message"] and kv["message"].startswith("decode:")
    assert condition(st, "Ready")["status"] == "False" and condition(st, "Ready")["reason"] == "KVTransportDegraded"
    assert condition(st, "Degraded")["status"] == "True" and condition(st, "Degraded")["reason"] == "TCPFallback"
    assert st["prefill"]["kvTransport"]["status"] == "True" and st["decode"]["kvTransport"]["reason"] == "TCPFallback"


async def test_a_verdict_of_wrong_types_and_non_finite_rates_is_tolerated(driver: FakeDriver, kube):
    """Issue 20 row 9: a verdict with "transport": [..] raised TypeError in the reconcile (the fleet
    never got a status again); NaN/Infinity GB/s reached the status. Now such fields are dropped."""
    await driver.create_cr(big(network={"ucxTransports": ["rc"], "preflight": {"minGBps": 10}}))
    st = await wait_status(driver, "llama", lambda s: s.get("revision"), "revision")
    rev = st["revision"]
    odd = json.dumps({**RDMA, "transport": ["rc", "tcp"], "gBps": float("nan")})
    weird = json.dumps({**RDMA, "gBps": float("inf")})
    await kube.simulate_leaderworkerset(NAMESPACE, f"llama-prefill-{rev}", init_message=odd)
    await kube.simulate_leaderworkerset(NAMESPACE, f"llama-decode-{rev}", init_message=weird)
    await driver.make_ready("Deployment", "llama-router")
    st = await wait_status(driver, "llama", lambda s: condition(s, "KVTransport")["status"] == "True"
                           and condition(s, "Ready")["status"] == "True", "KVTransport from odd verdicts")
    assert "transport" not in st["prefill"]["kvTransport"] and "gBps" not in st["prefill"]["kvTransport"]
    assert "gBps" not in st["decode"]["kvTransport"]
    text = json.dumps(st)
    assert "NaN" not in text and "Infinity" not in text


async def test_gang_provider_must_be_enabled(driver: FakeDriver):
    await driver.create_cr(big(scheduling={"gang": {"provider": "volcano"}}))
    st = await wait_status(driver, "llama", lambda s: condition(s, "Ready")["reason"] == "InvalidSpec", "InvalidSpec")
    assert "spec.scheduling.gang.provider" in condition(st, "Ready")["message"]
    assert await fleet_children(driver, "llama") == {}


async def test_volcano_podgroups_per_replica_follow_scaling(kube, start_operator):
    from operator_scenarios import IMAGE
    from pdfleet.operator.reconcile.reconciler import ReconcileOptions

    d = FakeDriver(kube)
    d.operator = await start_operator(reconcile=ReconcileOptions(default_image=IMAGE, drain_seconds=0.5, workers=2,
                                                                 gang_providers=("volcano",)))
    cr = await d.create_cr(big(scheduling={"gang": {"provider": "volcano"}, "queueName": "research"}))
    want = names_by_kind(expected_children(cr, NAMESPACE))
    await wait_children(d, "llama", want)
    st = await wait_status(d, "llama", lambda s: s.get("revision"), "revision")
    rev = st["revision"]
    pgs = {p["metadata"]["name"]: p for p in await d.list(PG, {"pdfleet.io/fleet": "llama"})}
    assert set(pgs) == {f"llama-{r}-{rev}-{g}" for r, n in (("prefill", 1), ("decode", 2)) for g in range(n)}
    assert all(p["spec"]["minMember"] == 2 and p["spec"]["queue"] == "research" for p in pgs.values())
    assert all(p["metadata"]["ownerReferences"][0]["uid"] == cr["metadata"]["uid"] for p in pgs.values())
    # Scaling decode down drops the second group's LeaderWorkerSet and PodGroup (same revision).
    await d.patch_cr("llama", {"spec": {"decode": {"replicas": 1}}})
    want = {**want, "LeaderWorkerSet": {f"llama-prefill-{rev}-0", f"llama-decode-{rev}-0"},
            "PodGroup": {f"llama-prefill-{rev}-0", f"llama-decode-{rev}-0"}}
    await wait_children(d, "llama", want)


async def test_a_cluster_without_the_leaderworkerset_crd_still_runs_single_node_fleets(operator_options_of):
    """kopf skips a watched kind whose CRD is missing: the operator must not wait for it forever."""
    from kube_fixture import fake_kube
    from pdfleet.operator import api
    from pdfleet.operator.reconcile.embedded import EmbeddedOperator

    async with fake_kube([(api.GROUP, api.VERSION, api.PLURAL, api.KIND)]) as server:
        server.namespaces.add(NAMESPACE)
        op = EmbeddedOperator(operator_options_of(str(server.url).rstrip("/")), namespaces=[NAMESPACE], clusterwide=False)
        await op.astart()
        try:
            d = FakeDriver(server)
            d.operator = op
            cr = await d.create_cr(fleet())
            await wait_children(d, "llama", names_by_kind(expected_children(cr, NAMESPACE)))
            await make_fleet_ready(d, "llama")
            await wait_status(d, "llama", lambda s: condition(s, "Ready")["status"] == "True", "Ready=True")
        finally:
            await op.astop()
        assert op.error is None


async def test_hand_made_leaderworkerset_pods_of_a_new_revision_switch_nothing(driver: FakeDriver, kube):
    """Issue 30, multi-node: ready pods wearing the new pair's pdfleet and LWS labels, whose controller
    reference names the LWS's leader StatefulSet by name with a made-up uid, neither switch the
    router nor become endpoints; the LWS controller's own pods (leader StatefulSet controlled by the
    LWS, workers' by their leader pod) then do."""
    old = await ready_then_new_image(driver)
    st = await wait_status(driver, "llama", lambda s: s["rollout"]["targetRevision"] != old, "a new target")
    new = st["rollout"]["targetRevision"]
    forged = []
    for role in ("prefill", "decode"):
        lws = await eventually(lambda: kube.get(LWS, NAMESPACE, f"llama-{role}-{new}"), what=f"{role} LWS")
        labels = {**lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["metadata"]["labels"],
                  "leaderworkerset.sigs.k8s.io/name": f"llama-{role}-{new}",
                  "leaderworkerset.sigs.k8s.io/worker-index": "0"}
        for g in range(2):
            name = f"llama-{role}-{new}-{g}"
            forged.append(name)
            await kube.put("v1/pods", NAMESPACE, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "labels": labels, "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "StatefulSet", "name": f"llama-{role}-{new}",
                    "uid": "made-up", "controller": True}]},
                "spec": {"containers": [{"name": "vllm", "ports": [{"name": "http", "containerPort": 8000}]}]},
                "status": {"phase": "Running", "podIP": f"10.9.0.{g + 1}",
                           "conditions": [{"type": "Ready", "status": "True"}]}})
    await settle(driver)
    st = await wait_status(driver, "llama", lambda s: condition(s, "Progressing")["reason"] == "RollingOut",
                           "still rolling out")
    assert st["revision"] == old, "hand-made LWS pods switched the router"
    assert {e["revision"] for e in st["endpoints"]["prefill"]} == {old}
    metrics = driver.operator.runtime["metrics"]
    assert metrics.registry.get_sample_value("pdfleet_operator_unowned_objects_ignored_total", {"kind": "Pod"}) >= 4

    for name in forged:  # the LWS controller's own pods of those names
        await kube.remove("v1/pods", NAMESPACE, name)
    await kube.simulate_deployment(NAMESPACE, "llama-router")  # the router rolls out the new image too
    for role in ("prefill", "decode"):
        await kube.simulate_leaderworkerset(NAMESPACE, f"llama-{role}-{new}")
    st = await wait_status(driver, "llama", lambda s: s["revision"] == new, "the switch, on the LWS's own pods")
    assert not any(e["ip"].startswith("10.9.") for e in st["endpoints"]["prefill"])
