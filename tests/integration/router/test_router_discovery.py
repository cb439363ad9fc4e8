"""EndpointSlice discovery through kmock's real HTTP server (list + watch), end to end:
slices appear, turn ready and vanish; the router follows and never mixes revisions."""

from __future__ import annotations

import asyncio
import json

import pytest
import yaml

from pdfleet.contract import labels

pytestmark = pytest.mark.timeout(60)

NS = "serving"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NS}/endpointslices"
SERVICES = f"/api/v1/namespaces/{NS}/services"
COMPLETION = {"model": "tiny", "prompt": "hi", "max_tokens": 3}


def service(role, revision, *, fleet="f1", fleet_uid="uid-fleet-f1"):
    """The headless Service the operator makes for one role at one revision (controlled by the fleet)."""
    name = f"{fleet}-{role}-{revision}"
    return {"apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": NS, "uid": f"uid-{name}",
                         "labels": {"pdfleet.io/fleet": fleet, "pdfleet.io/role": role, "pdfleet.io/revision": revision},
                         "ownerReferences": [{"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference",
                                              "name": fleet, "uid": fleet_uid, "controller": True}]},
            "spec": {"clusterIP": "None", "selector": {"pdfleet.io/fleet": fleet, "pdfleet.io/role": role}}}


def endpoint_slice(name, engine, role, revision, *, ready=True, fleet="f1", created="2026-01-01T00:00:00Z",
                   owned=True, service_uid=None, serving=False):
    """A slice as the EndpointSlice controller makes it for service(role, revision) (owned=False: by hand,
    with the same labels)."""
    port = int(engine.url.rsplit(":", 1)[1])
    svc = f"{fleet}-{role}-{revision}"
    meta = {"name": name, "namespace": NS, "creationTimestamp": created,
            "labels": {"pdfleet.io/fleet": fleet, "pdfleet.io/role": role, "pdfleet.io/revision": revision,
                       "kubernetes.io/service-name": svc,
                       **({labels.SERVING: labels.SERVING_TRUE} if serving else {})}}
    if owned:
        meta["labels"]["endpointslice.kubernetes.io/managed-by"] = "endpointslice-controller.k8s.io"
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Service", "name": svc,
                                    "uid": service_uid or f"uid-{svc}", "controller": True}]
    return {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": meta,
        "addressType": "IPv4",
        "ports": [{"name": "kv", "port": 1, "protocol": "TCP"}, {"name": "http", "port": port, "protocol": "TCP"}],
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": ready}}],
    }


@pytest.fixture
def api(kmock):
    kmock.resources.load_bundled()
    return kmock


async def apply(fleet, api, obj):
    path = SERVICES if obj["kind"] == "Service" else SLICES
    async with fleet.session.post(str(api.url).rstrip("/") + path, json=obj) as r:
        assert r.status in (200, 201), await r.text()
    if obj["kind"] == "EndpointSlice" and "ownerReferences" in obj["metadata"]:  # its Service, as the operator made it
        role, rev = obj["metadata"]["labels"]["pdfleet.io/role"], obj["metadata"]["labels"]["pdfleet.io/revision"]
        svc = service(role, rev, fleet=obj["metadata"]["labels"]["pdfleet.io/fleet"])
        async with fleet.session.post(str(api.url).rstrip("/") + SERVICES, json=svc) as r:
            assert r.status in (200, 201, 409), await r.text()


async def patch(fleet, api, name, patch_body):
    async with fleet.session.patch(f"{str(api.url).rstrip('/')}{SLICES}/{name}", json=patch_body,
                                   headers={"Content-Type": "application/merge-patch+json"}) as r:
        assert r.status == 200, await r.text()


async def delete(fleet, api, name):
    async with fleet.session.delete(f"{str(api.url).rstrip('/')}{SLICES}/{name}") as r:
        assert r.status == 200, await r.text()


async def wait_health(fleet, url, predicate, what):
    for _ in range(100):
        async with fleet.session.get(url + "/health") as r:
            h = await r.json()
        if predicate(h):
            return h
        await asyncio.sleep(0.05)
    raise AssertionError(f"router never reached: {what}; last /health: {h}")


async def serve(fleet, url, n):
    served = []
    for _ in range(n):
        async with fleet.session.post(url + "/v1/completions", json=COMPLETION) as r:
            assert r.status == 200
            body = await r.json()
        served.append((body["kv_seen"]["remote_engine_id"], body["served_by"]))
    return served


@pytest.fixture
def kubeconfig(tmp_path, api):
    cfg = {
        "apiVersion": "v1", "kind": "Config", "current-context": "kmock",
        "clusters": [{"name": "kmock", "cluster": {"server": str(api.url).rstrip("/")}}],
        "users": [{"name": "router", "user": {"token": "router-token"}}],
        "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "router"}}],
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(cfg))
    return str(path)


async def test_router_follows_endpointslices_and_never_mixes_revisions(api, kubeconfig, fleet):
    pa, da = await fleet.engine("pA", "prefill"), await fleet.engine("dA", "decode")
    pb, db = await fleet.engine("pB", "prefill"), await fleet.engine("dB", "decode")
    px, dx = await fleet.engine("pX", "prefill"), await fleet.engine("dX", "decode")
    await apply(fleet, api, endpoint_slice("f1-p-r1", pa, "prefill", "r1"))
    await apply(fleet, api, endpoint_slice("f1-d-r1", da, "decode", "r1"))
    # another fleet's newer revision in the same namespace (kmock ignores labelSelector: the router filters too)
    await apply(fleet, api, endpoint_slice("f2-p", px, "prefill", "r9", fleet="f2", created="2026-09-01T00:00:00Z"))
    await apply(fleet, api, endpoint_slice("f2-d", dx, "decode", "r9", fleet="f2", created="2026-09-01T00:00:00Z"))

    url = await fleet.router([], [], kubernetes_fleet="f1", kubernetes_namespace=NS, kubeconfig=kubeconfig)
    await wait_health(fleet, url, lambda h: h["revision"] == "r1", "serving r1")
    assert await serve(fleet, url, 3) == [("pA", "dA")] * 3

    # a new revision appears with its decode not ready yet: r1 keeps serving
    await apply(fleet, api, endpoint_slice("f1-p-r2", pb, "prefill", "r2", created="2026-02-01T00:00:00Z"))
    await apply(fleet, api, endpoint_slice("f1-d-r2", db, "decode", "r2", ready=False,
                                           created="2026-02-01T00:00:00Z"))
    await wait_health(fleet, url, lambda h: "r2" in h["revisions"], "seeing r2")
    assert (await wait_health(fleet, url, lambda h: True, ""))["revision"] == "r1"
    assert await serve(fleet, url, 3) == [("pA", "dA")] * 3

    # r2's decode turns ready: r2 takes new requests, both legs from r2
    await patch(fleet, api, "f1-d-r2", {"endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]})
    await wait_health(fleet, url, lambda h: h["revision"] == "r2", "serving r2")
    assert await serve(fleet, url, 3) == [("pB", "dB")] * 3

    # r2's prefill slice goes away: back to r1
    await delete(fleet, api, "f1-p-r2")
    await wait_health(fleet, url, lambda h: h["revision"] == "r1", "back to r1")
    assert await serve(fleet, url, 2) == [("pA", "dA")] * 2

    assert px.received == [] and dx.received == []
    assert len(pa.received) == len(da.received) == 8 and len(pb.received) == len(db.received) == 3
    api_requests = [r for r in api if "endpointslices" in str(r.url) and r.method == "GET"]
    assert api_requests, "the router never asked the API server"
    assert all(r.headers.get("Authorization") == "Bearer router-token" for r in api_requests)
    assert any(r.params.get("watch") == "true" for r in api_requests)
    assert all(r.params.get("labelSelector") == "pdfleet.io/fleet=f1" for r in api_requests)


async def test_the_revision_labelled_serving_wins_while_serviceable(api, kubeconfig, fleet):
    pa, da = await fleet.engine("pA", "prefill"), await fleet.engine("dA", "decode")
    pb, db = await fleet.engine("pB", "prefill"), await fleet.engine("dB", "decode")
    for name, eng, role, rev, created in [("p1", pa, "prefill", "r1", "2026-01-01T00:00:00Z"),
                                          ("d1", da, "decode", "r1", "2026-01-01T00:00:00Z"),
                                          ("p2", pb, "prefill", "r2", "2026-02-01T00:00:00Z"),
                                          ("d2", db, "decode", "r2", "2026-02-01T00:00:00Z")]:
        await apply(fleet, api, endpoint_slice(name, eng, role, rev, created=created, serving=rev == "r1"))
    url = await fleet.router([], [], kubernetes_fleet="f1", kubernetes_namespace=NS, kubeconfig=kubeconfig)
    # r1 is older, but the operator labels it serving
    await wait_health(fleet, url, lambda h: h["revision"] == "r1" and len(h["revisions"]) == 2, "serving r1")
    assert await serve(fleet, url, 2) == [("pA", "dA")] * 2
    # r1 loses its only ready decode: the newest serviceable revision takes over (the documented rule)
    await patch(fleet, api, "d1", {"endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": False}}]})
    await wait_health(fleet, url, lambda h: h["revision"] == "r2", "falling over to r2")
    assert await serve(fleet, url, 2) == [("pB", "dB")] * 2
    # ...and goes back to r1 when it is serviceable again
    await patch(fleet, api, "d1", {"endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]})
    await wait_health(fleet, url, lambda h: h["revision"] == "r1", "back to r1")
    # The operator moves the label to r2: the same router process follows, no restart.
    for name in ("p2", "d2"):
        await patch(fleet, api, name, {"metadata": {"labels": {labels.SERVING: labels.SERVING_TRUE}}})
    for name in ("p1", "d1"):
        await patch(fleet, api, name, {"metadata": {"labels": {labels.SERVING: "false"}}})
    await wait_health(fleet, url, lambda h: h["revision"] == "r2", "the label moved to r2")
    assert await serve(fleet, url, 2) == [("pB", "dB")] * 2


async def test_list_errors_keep_last_endpoints_and_watch_errors_relist():
    """Against a scripted API server: a list that fails keeps what the router knew
    (and is retried, with backoff); a malformed watch line is dropped; an ERROR
    event (410 Gone) makes the router list again."""
    from aiohttp import web

    from pdfleet.connector.router.app import Router
    from pdfleet.contract.router_config import RouterConfig
    from pdfleet.connector.serving.discovery import ApiAccess, kubernetes_discovery

    class Engine:  # only its URL matters here
        def __init__(self, port):
            self.url = f"http://127.0.0.1:{port}"

    lists, watches = [], []
    script = {"list_status": 200}
    r1 = [endpoint_slice("p1", Engine(1001), "prefill", "r1"), endpoint_slice("d1", Engine(1002), "decode", "r1")]
    r2p = endpoint_slice("p2", Engine(2001), "prefill", "r2", created="2026-02-01T00:00:00Z")
    r2d = endpoint_slice("d2", Engine(2002), "decode", "r2", created="2026-02-01T00:00:00Z")

    async def handler(request):
        if request.query.get("watch") != "true":
            lists.append(request.query.get("labelSelector"))
            if script["list_status"] != 200:
                return web.json_response({"kind": "Status", "code": 500}, status=script["list_status"])
            return web.json_response({"metadata": {"resourceVersion": "7"}, "items": r1})
        watches.append(request.query.get("resourceVersion"))
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"{not json\n")
        await resp.write(json.dumps({"type": "ADDED", "object": r2p}).encode() + b"\n")
        await resp.write(json.dumps({"type": "ADDED", "object": r2d}).encode() + b"\n")
        await asyncio.sleep(0.2)
        script["list_status"] = 500  # from now on the API server fails
        await resp.write(json.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 410,
                                                                  "message": "too old"}}).encode() + b"\n")
        await asyncio.sleep(3600)
        return resp

    async def services(request):
        return web.json_response({"items": [service(role, rev) for role in ("prefill", "decode")
                                            for rev in ("r1", "r2")]})

    app = web.Application()
    app.router.add_get(SLICES, handler)
    app.router.add_get(SERVICES, services)
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    server = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
    config = RouterConfig(kubernetes_fleet="f1", kubernetes_namespace=NS)
    router = Router(config)
    seen = []
    original = router.set_endpoints

    def record(groups):
        groups = list(groups)
        seen.append(sorted(g.revision for g in groups))
        original(groups)

    router.set_endpoints = record
    task = asyncio.create_task(kubernetes_discovery(config, access=lambda c: ApiAccess(server, {}, False))(router))
    try:
        for _ in range(100):
            if len(lists) >= 3:
                break
            await asyncio.sleep(0.05)
        assert len(lists) >= 3, lists  # listed, relisted after ERROR, retried after the failure
        assert lists[0] == "pdfleet.io/fleet=f1" and watches[0] == "7"
        assert seen[:3] == [["r1"], ["r1", "r2"], ["r1", "r2"]]
        assert len(seen) == 3  # failing lists changed nothing
        assert router.selection.revision.revision == "r2"
        assert router.selection.revision.ready("decode") == ("http://127.0.0.1:2002",)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await runner.cleanup()


async def test_hand_made_slices_with_the_fleets_labels_get_no_traffic(api, kubeconfig, fleet):
    """Row 1 of issue 20: anyone who may create EndpointSlices copies the fleet's labels. Only the
    EndpointSlice controller's slices of the fleet's own Services are used; each other slice is counted once."""
    pa, da = await fleet.engine("pA", "prefill"), await fleet.engine("dA", "decode")
    ep, ed = await fleet.engine("evilP", "prefill"), await fleet.engine("evilD", "decode")
    await apply(fleet, api, endpoint_slice("f1-p-r1", pa, "prefill", "r1"))
    await apply(fleet, api, endpoint_slice("f1-d-r1", da, "decode", "r1"))
    # labels only, in the serving revision
    await apply(fleet, api, endpoint_slice("evil-p", ep, "prefill", "r1", owned=False))
    # the controller's label and an owner reference by name, but not the Service's uid
    await apply(fleet, api, endpoint_slice("evil-d", ed, "decode", "r1", service_uid="uid-made-up"))
    # a Service of the fleet's labels that the fleet does not control, and the controller's slice of it
    rogue = service("decode", "r1")
    rogue["metadata"].update(name="rogue", uid="uid-rogue", ownerReferences=[])
    await apply(fleet, api, rogue)
    slice_of_rogue = endpoint_slice("rogue-d", ed, "decode", "r1")
    slice_of_rogue["metadata"]["labels"]["kubernetes.io/service-name"] = "rogue"
    slice_of_rogue["metadata"]["ownerReferences"][0].update(name="rogue", uid="uid-rogue")
    async with fleet.session.post(str(api.url).rstrip("/") + SLICES, json=slice_of_rogue) as r:
        assert r.status in (200, 201)

    url = await fleet.router([], [], kubernetes_fleet="f1", kubernetes_namespace=NS, kubeconfig=kubeconfig,
                             kubernetes_fleet_uid="uid-fleet-f1")
    await wait_health(fleet, url, lambda h: h["revision"] == "r1", "serving r1")
    assert await serve(fleet, url, 4) == [("pA", "dA")] * 4
    # a change to a legitimate slice republishes: the refused ones are not counted again
    await patch(fleet, api, "f1-d-r1", {"metadata": {"annotations": {"touched": "1"}}})
    assert await serve(fleet, url, 2) == [("pA", "dA")] * 2
    assert ep.received == [] and ed.received == []
    async with fleet.session.get(url + "/metrics") as r:
        metrics = await r.text()
    assert "pdfleet_router_endpointslices_refused_total 3.0" in metrics, metrics
