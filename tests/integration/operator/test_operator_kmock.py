"""The kopf operator end to end against FakeKube: children, status, rollouts, failures, restarts."""

from __future__ import annotations

import asyncio
import json

import pytest
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import Fault, eventually
from operator_scenarios import (
    CR_RESOURCE,
    IMAGE,
    STS,
    condition,
    expected_children,
    fleet,
    fleet_children,
    make_fleet_ready,
    names_by_kind,
    scenario_create,
    scenario_delete,
    scenario_features_off,
    scenario_invalid_spec,
    scenario_paired_rollout,
    scenario_scale,
    scenario_status_follows_children,
    status_of,
    wait_children,
    wait_status,
)

from pdfleet.operator.reconcile.reconciler import ReconcileOptions

pytestmark = pytest.mark.timeout(60)


async def test_create_makes_every_child_with_owner_references(driver: FakeDriver):
    await scenario_create(driver)


async def test_status_follows_statefulsets_and_pods(driver: FakeDriver):
    await scenario_status_follows_children(driver)


async def test_scale_updates_in_place_without_new_revision(driver: FakeDriver):
    await scenario_scale(driver)


async def test_invalid_spec_touches_no_child(driver: FakeDriver):
    await scenario_invalid_spec(driver)


async def test_delete_leaves_children_to_the_garbage_collector(driver: FakeDriver):
    await scenario_delete(driver)


async def test_children_the_plan_drops_are_deleted(driver: FakeDriver):
    await scenario_features_off(driver)


async def test_paired_rollout_never_mixes_revisions(kube, start_operator):
    # A drain long enough that the old pair outlives the switch (status times have 1 s resolution).
    driver = FakeDriver(kube)
    driver.operator = await start_operator(reconcile=ReconcileOptions(default_image=IMAGE, drain_seconds=2.0,
                                                                      workers=2))
    await scenario_paired_rollout(driver, drain_seconds=2.0)
    # Every status the API server ever held: the endpoints handed to the router are of one
    # revision, the one status.revision names.
    history = [v for v in kube.objects[CR_RESOURCE, NAMESPACE, "llama"].history if v is not None]
    statuses = [dict(v).get("status") or {} for v in history]
    revisions = list(dict.fromkeys(s["revision"] for s in statuses if s.get("revision")))
    assert len(revisions) == 2, f"no rollout happened: {revisions}"
    for s in statuses:
        endpoint_revisions = {e["revision"] for e in (s.get("endpoints") or {}).get("prefill", [])}
        assert endpoint_revisions <= {s.get("revision")}, s
    # The router's pod template changed once, for the new block size the spec asked for (the router
    # hashes prompts as the engines do), and not at the switch (scenario_paired_rollout checks that):
    # apart from --block-size, every version the API server held is the same.
    routers = [dict(v) for v in kube.objects["apps/v1/deployments", NAMESPACE, "llama-router"].history if v]
    templates = [json.dumps(r["spec"]["template"], sort_keys=True, default=dict) for r in routers]
    assert len(set(templates)) == 2, f"the router's pod template changed {len(set(templates)) - 1} times"
    args = [r["spec"]["template"]["spec"]["containers"][0]["args"] for r in routers]
    blockless = {json.dumps(list(a[:a.index("--block-size")]) + list(a[a.index("--block-size") + 2:])) for a in args}
    assert len(blockless) == 1 and not any("--revision" in a for a in args)
    # The serving label moved with status.revision: on the old pair's Services before the switch,
    # on the new pair's after it, and the old pair lost it (or was deleted) after the switch.
    for rev, other in ((revisions[0], revisions[1]), (revisions[1], None)):
        labelled = [dict(v)["metadata"].get("labels", {}).get("pdfleet.io/serving")
                    for v in kube.objects["v1/services", NAMESPACE, f"llama-prefill-{rev}"].history if v]
        assert "true" in labelled, (rev, labelled)
        if other:  # the old revision: labelled first, unlabelled before it went
            assert labelled[0] == "true" and labelled[-1] is None, labelled


async def test_noop_resync_sends_zero_writes(kube, start_operator):
    d = FakeDriver(kube)
    d.operator = await start_operator()
    await scenario_create(d)
    await make_fleet_ready(d, "llama")
    await wait_status(d, "llama", lambda s: condition(s, "Progressing")["status"] == "False", "settled")
    await asyncio.sleep(0.5)
    await d.operator.astop()

    # A fresh operator lists everything (a full resync) and finds nothing to do; its watches
    # end every second (server-side timeout) and are re-established: nothing to do either.
    mark = len(kube.calls)
    d.operator = await start_operator(watch_server_timeout=1.0, watch_client_timeout=3.0)
    await eventually(lambda: d.operator.runtime["reconciler"].runs >= 1, what="a reconcile after restart")
    # A change of the CR that is not a spec change also triggers a reconcile.
    await d.patch_cr("llama", {"metadata": {"annotations": {"touched": "yes"}}})
    await eventually(lambda: d.operator.runtime["reconciler"].runs >= 2, what="a reconcile after the touch")
    await asyncio.sleep(2.5)
    rewatches = [c for c in kube.operator_calls(mark) if c.verb == "watch" and c.resource == "statefulsets"]
    assert len(rewatches) >= 2, "no watch was re-established in the window"
    # The one exception: a fresh operator asks once to create each of the fleet's generated Secrets (the
    # side-channel key and the engines' API token; it never reads Secrets); the API answers 409
    # AlreadyExists and nothing changes.
    writes = [w for w in kube.writes(mark) if not (w.resource == "secrets" and w.status == 409)]
    assert writes == [], writes
    assert len(kube.writes(mark)) - len(writes) <= 2
    reads = {c.verb for c in kube.operator_calls(mark) if c.resource != "secrets"}
    assert reads <= {"list", "watch"}
    assert d.operator.runtime["metrics"].count("pdfleet_operator_reconciles_total", {"result": "unchanged"}) >= 2

    # Negative control: the same counting sees the writes of a real change.
    await d.patch_cr("llama", {"spec": {"decode": {"replicas": 2}}})
    await eventually(lambda: any(c.resource == "statefulsets" for c in kube.writes(mark)), what="a write")


async def test_transient_errors_are_retried(kube, start_operator):
    d = FakeDriver(kube)
    kube.faults += [Fault(409, 2, resource="statefulsets"), Fault(429, 1, resource="configmaps"),
                    Fault(500, 1, resource="deployments")]
    d.operator = await start_operator()
    await scenario_create(d)
    st = await status_of(d, "llama")
    assert condition(st, "Degraded")["status"] == "False"
    assert all(f.hits == f.count for f in kube.faults)
    codes = {c.status for c in kube.writes() if c.resource in ("statefulsets", "configmaps", "deployments")}
    assert {409, 429, 500} <= codes


async def test_persistent_failure_is_reported_then_restart_converges(kube, start_operator):
    d = FakeDriver(kube)
    kube.faults.append(Fault(500, 10_000, resource="statefulsets"))
    d.operator = await start_operator()
    cr = await d.create_cr(fleet())
    st = await wait_status(d, "llama", lambda s: condition(s, "Degraded")["status"] == "True", "Degraded")
    assert condition(st, "Ready")["reason"] == "ApplyFailed" and "StatefulSet" in condition(st, "Ready")["message"]
    assert [e for e in kube.list("v1/events", NAMESPACE) if e["reason"] == "ApplyFailed" and e["type"] == "Warning"]
    have = await fleet_children(d, "llama")
    assert "StatefulSet" not in have and "ConfigMap" in have  # partial progress, nothing crashed

    # Stop mid-way, heal the API, start again: the new operator converges.
    await d.operator.astop()
    kube.faults.clear()
    d.operator = await start_operator()
    await wait_children(d, "llama", names_by_kind(expected_children(cr, NAMESPACE)))
    await wait_status(d, "llama", lambda s: condition(s, "Degraded")["status"] == "False", "healed")


async def test_stop_during_a_reconcile_then_restart_converges(kube, start_operator):
    d = FakeDriver(kube)
    release = asyncio.Event()
    hold = Fault(None, 2, resource="statefulsets", hold=release)  # StatefulSet applies hang until released
    kube.faults.append(hold)
    d.operator = await start_operator()
    cr = await d.create_cr(fleet())
    await eventually(lambda: hold.hits >= 1, what="a StatefulSet apply in flight")
    await d.operator.astop()          # mid-reconcile: StatefulSet applies in flight
    release.set()
    d.operator = await start_operator()
    await wait_children(d, "llama", names_by_kind(expected_children(cr, NAMESPACE)))
    await make_fleet_ready(d, "llama")
    await wait_status(d, "llama", lambda s: condition(s, "Ready")["status"] == "True", "Ready after restart")


async def test_two_fleets_are_independent(driver: FakeDriver, kube):
    await driver.create_cr(fleet("alpha"))
    await driver.create_cr(fleet("beta", prefill={"replicas": 2}))
    for name in ("alpha", "beta"):
        cr = kube.get(CR_RESOURCE, NAMESPACE, name)
        await wait_children(driver, name, names_by_kind(expected_children(cr, NAMESPACE)))
    await driver.delete_cr("alpha")
    await wait_children(driver, "alpha", {})
    await wait_status(driver, "beta", lambda s: s.get("revision"), "beta's status")
    beta = kube.get(CR_RESOURCE, NAMESPACE, "beta")
    assert await fleet_children(driver, "beta") == names_by_kind(expected_children(beta, NAMESPACE))
    assert kube.get(STS, NAMESPACE, f"beta-prefill-{beta['status']['revision']}")["spec"]["replicas"] == 2


async def test_all_namespaces_mode_and_label_selected_watches(kube, start_operator):
    kube.namespaces |= {"team-b"}
    op = await start_operator(clusterwide=True)
    d_a = FakeDriver(kube)
    await d_a.create_cr(fleet("alpha"))
    resp = await kube.post("/apis/pdfleet.io/v1alpha1/namespaces/team-b/disaggregatedinferences", json=fleet("beta"))
    assert resp.status == 201
    await eventually(lambda: kube.list(STS, "team-b", {"pdfleet.io/fleet": "beta"}) and
                     kube.list(STS, NAMESPACE, {"pdfleet.io/fleet": "alpha"}), what="children in both namespaces")
    # Children and pods are watched cluster-wide, selected by the fleet label on the server side.
    watches = {(c.resource, c.namespace, c.label_selector) for c in kube.operator_calls() if c.verb == "watch"}
    assert ("pods", None, "pdfleet.io/fleet") in watches
    assert ("statefulsets", None, "pdfleet.io/fleet") in watches
    assert op.runtime["metrics"].count("pdfleet_operator_fleets") == 2


async def test_peering_mode_reconciles_while_it_holds_the_peering(kube, start_operator):
    # kopf's peering CRD (the chart ships it) and the chart's KopfPeering object in the namespace.
    kube.resources["kopf.dev/v1/kopfpeerings"] = kube.ResourceInfo(
        kind="KopfPeering", singular="kopfpeering", namespaced=True,
        verbs={"get", "list", "watch", "patch", "create", "delete"})
    await kube.put("kopf.dev/v1/kopfpeerings", NAMESPACE,
                   {"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "pdfleet"}})
    d = FakeDriver(kube)
    d.operator = await start_operator(peering_name="pdfleet")
    await scenario_create(d)
    peering = kube.get("kopf.dev/v1/kopfpeerings", NAMESPACE, "pdfleet")
    assert peering.get("status"), "the operator did not announce itself in the peering object"


async def test_replicas_scaled_by_hand_are_restored(driver: FakeDriver, kube):
    await scenario_create(driver)
    rev = (await status_of(driver, "llama"))["revision"]
    resp = await kube.patch(f"/apis/apps/v1/namespaces/{NAMESPACE}/statefulsets/llama-decode-{rev}",
                            json={"spec": {"replicas": 5}}, headers={"Content-Type": "application/merge-patch+json"})
    assert resp.status == 200
    await eventually(lambda: kube.get(STS, NAMESPACE, f"llama-decode-{rev}")["spec"]["replicas"] == 1,
                     what="replicas restored to the spec's")


async def test_endpoints_follow_a_prefill_pod_that_moved(driver: FakeDriver, kube):
    await scenario_create(driver)
    await make_fleet_ready(driver, "llama")
    st = await wait_status(driver, "llama", lambda s: s["endpoints"]["prefill"], "an endpoint")
    (endpoint,) = st["endpoints"]["prefill"]
    pod = kube.get("v1/pods", NAMESPACE, endpoint["pod"])
    moved = {**pod["status"], "podIP": "10.9.9.9", "podIPs": [{"ip": "10.9.9.9"}]}
    await kube.set_status("v1/pods", NAMESPACE, endpoint["pod"], moved)   # restarted on another node
    st = await wait_status(driver, "llama", lambda s: s["endpoints"]["prefill"][0]["ip"] == "10.9.9.9", "new IP")
    assert [e["pod"] for e in st["endpoints"]["prefill"]] == [endpoint["pod"]]
