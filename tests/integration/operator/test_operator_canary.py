"""Canary rollouts end to end (issue 22): the real kopf operator against FakeKube, a real router
(real HTTP, EndpointSlice discovery through the same API server) in front of fake engines of two
revision pairs, and a steady client load.

The test plays the EndpointSlice controller only: it copies each engine Service's labels onto a
slice whose endpoint is that revision's fake engine, as Kubernetes does. Everything else is the
product: the operator labels the canary pair's Services with its weight, the router splits by it and
counts per revision, the operator reads the router's /metrics and steps, promotes or aborts."""

from __future__ import annotations

import asyncio
import json
import pathlib
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import FakeKube, eventually
from operator_scenarios import CR_RESOURCE, DEPLOY, IMAGE, STS, condition, fleet, wait_status

from pdfleet.connector.router.app import start_router
from pdfleet.connector.serving.ownership import MANAGED_BY_LABEL, SERVICE_NAME_LABEL, SLICE_CONTROLLER
from pdfleet.contract import labels
from pdfleet.contract import metrics as metric_names
from pdfleet.contract.router_config import RouterConfig
from pdfleet.operator.reconcile.reconciler import ReconcileOptions

from router_fakes import FakeEngine  # noqa: E402

pytestmark = pytest.mark.timeout(90)
SLICES = "discovery.k8s.io/v1/endpointslices"
SERVICES = "v1/services"
FAST = ReconcileOptions(default_image=IMAGE, drain_seconds=0.5, workers=2, canary_interval_s=0.2)


def canary_fleet(port: int, steps: list[dict[str, Any]], **canary: Any) -> dict[str, Any]:
    return fleet(router={"replicas": 1, "port": port},
                 rollout={"strategy": "Canary", "canary": {
                     "steps": steps,
                     "analysis": {"maxErrorRate": 0.05, "ttftMs": 5000, "minRequests": 15}, **canary}})


class Cluster:
    """Fake engines per revision, a real router, the slice controller's part, and a client load."""

    def __init__(self, kube: FakeKube, tmp_path: pathlib.Path):
        self.kube = kube
        self.tmp_path = tmp_path
        self.engines: dict[str, dict[str, FakeEngine]] = {}  # revision -> role -> engine
        self.tasks: list[asyncio.Task] = []
        self.stop = asyncio.Event()
        self.answered: list[str] = []  # the revision of each answered request, in order
        self.runner = None
        self.port = 0

    async def pair(self, revision: str, **decode: Any) -> None:
        p, d = FakeEngine(f"p-{revision}", "prefill"), FakeEngine(f"d-{revision}", "decode", **decode)
        await p.start()
        await d.start()
        self.engines[revision] = {"prefill": p, "decode": d}

    def router_config(self, fleet_uid: str) -> RouterConfig:
        """A front end's config: the fleet's EndpointSlices through this API server, tight timeouts."""
        cfg = {"apiVersion": "v1", "kind": "Config", "current-context": "k",
               "clusters": [{"name": "k", "cluster": {"server": str(self.kube.url).rstrip("/")}}],
               "users": [{"name": "r", "user": {"token": "t"}}],
               "contexts": [{"name": "k", "context": {"cluster": "k", "user": "r"}}]}
        path = self.tmp_path / "kubeconfig"
        path.write_text(yaml.safe_dump(cfg))
        return RouterConfig(kubernetes_fleet="llama", kubernetes_namespace=NAMESPACE, kubeconfig=str(path),
                            kubernetes_fleet_uid=fleet_uid, connect_timeout_s=1.0, prefill_timeout_s=2.0,
                            decode_first_byte_timeout_s=2.0, decode_idle_timeout_s=2.0, eject_s=0.0)

    async def start_router(self, fleet_uid: str) -> None:
        self.runner, bound = await start_router(self.router_config(fleet_uid), "127.0.0.1", self.port)
        assert bound == self.port

    async def router_pod(self) -> None:
        """The router Deployment's pod as Kubernetes makes it (through a ReplicaSet): the canary
        analysis reads only pods the fleet's workloads run (issue 30)."""
        await eventually(lambda: self.kube.get(DEPLOY, NAMESPACE, "llama-router"), what="the router Deployment")
        await self.kube.simulate_deployment(NAMESPACE, "llama-router", pods=True, ip="127.0.0.1")

    async def forged_router_pod(self, port: int) -> None:
        """A pod anyone who may create pods in the namespace can make: the router's labels, no owner."""
        meta = {"name": "llama-router-abc12",
                "labels": {"pdfleet.io/fleet": "llama", "pdfleet.io/role": "router", "app.kubernetes.io/name": "pdfleet"}}
        await self.kube.put("v1/pods", NAMESPACE, {
            "apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [{"name": "router", "ports": [{"name": "http", "containerPort": port}]}]},
            "status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}})

    def sync_slices(self) -> None:
        """The EndpointSlice controller: one slice per engine Service, with the Service's labels."""
        async def once() -> None:
            services = {s["metadata"]["name"]: s for s in self.kube.list(SERVICES, NAMESPACE, {labels.FLEET: "llama"})
                        if (s["metadata"]["labels"] or {}).get(labels.ROLE) in labels.ENGINE_ROLES}
            for name, svc in services.items():
                meta = svc["metadata"]
                engine = self.engines.get(meta["labels"][labels.REVISION], {}).get(meta["labels"][labels.ROLE])
                if engine is None:
                    continue
                want = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                        "metadata": {"name": name, "labels": {**meta["labels"], MANAGED_BY_LABEL: SLICE_CONTROLLER,
                                                              SERVICE_NAME_LABEL: name},
                                     "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name,
                                                          "uid": meta["uid"], "controller": True}]},
                        "ports": [{"name": "http", "port": int(engine.url.rsplit(":", 1)[1]), "protocol": "TCP"}],
                        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}]}
                have = self.kube.get(SLICES, NAMESPACE, name)
                if have is None or have["metadata"].get("labels") != want["metadata"]["labels"]:
                    await self.kube.put(SLICES, NAMESPACE, want)
            for s in self.kube.list(SLICES, NAMESPACE):
                if s["metadata"]["name"] not in services:
                    await self.kube.remove(SLICES, NAMESPACE, s["metadata"]["name"])

        async def loop() -> None:
            while not self.stop.is_set():
                await once()
                await asyncio.sleep(0.05)

        self.tasks.append(asyncio.create_task(loop()))

    def load(self, workers: int = 4) -> None:
        async def worker(w: int) -> None:
            n = 0
            async with aiohttp.ClientSession() as session:
                while not self.stop.is_set():
                    n += 1
                    body = {"model": "tiny", "prompt": f"conversation {w}-{n}: hello", "max_tokens": 3}
                    try:
                        async with session.post(f"http://127.0.0.1:{self.port}/v1/completions", json=body) as r:
                            await r.read()
                            if r.status == 200:
                                self.answered.append(r.headers.get("x-pdfleet-revision", ""))
                    except aiohttp.ClientError:
                        pass
                    await asyncio.sleep(0.01)

        self.tasks += [asyncio.create_task(worker(w)) for w in range(workers)]

    async def close(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.runner is not None:
            await self.runner.cleanup()
        for pair in self.engines.values():
            for e in pair.values():
                await e.stop()


@pytest.fixture
async def cluster(kube: FakeKube, tmp_path: pathlib.Path, unused_tcp_port: int):
    c = Cluster(kube, tmp_path)
    c.port = unused_tcp_port
    try:
        yield c
    finally:
        await c.close()


def events(kube: FakeKube, reason: str) -> list[dict[str, Any]]:
    return [e for e in kube.list("v1/events", NAMESPACE) if e["reason"] == reason]


def service_weights(kube: FakeKube, revision: str) -> set[str | None]:
    return {(s["metadata"].get("labels") or {}).get(labels.CANARY_WEIGHT)
            for s in kube.list(SERVICES, NAMESPACE, {labels.FLEET: "llama", labels.REVISION: revision})}


def router_template(kube: FakeKube) -> str:
    return json.dumps(kube.get(DEPLOY, NAMESPACE, "llama-router")["spec"]["template"], sort_keys=True)


async def start_canary(driver: FakeDriver, cluster: Cluster, steps: list[dict[str, Any]], *, breach: bool = False,
                       spec: dict[str, Any] | None = None, **canary: Any) -> tuple[str, str]:
    """A fleet serving revision S, then a spec change to revision T whose pair comes up ready: (S, T).
    ``spec``: more of the fleet's spec (e.g. a Gateway's inferencePool)."""
    kube = driver.kube
    body = canary_fleet(cluster.port, steps, **canary)
    body["spec"].update(spec or {})
    cr = await driver.create_cr(body)
    await cluster.router_pod()
    await eventually(lambda: len(kube.list(STS, NAMESPACE)) == 2, what="the first pair")
    for sts in kube.list(STS, NAMESPACE):
        await kube.simulate_statefulset(NAMESPACE, sts["metadata"]["name"])
    st = await wait_status(driver, "llama", lambda s: s.get("revision") and s["endpoints"]["prefill"], "serving S")
    old = st["revision"]
    await cluster.pair(old)
    cluster.sync_slices()
    await cluster.start_router(cr["metadata"]["uid"])
    cluster.load()
    await eventually(lambda: len(cluster.answered) > 10, what="the router serving S")

    # A spec change that needs a new pair (vLLM flags both roles must share).
    await driver.patch_cr("llama", {"spec": {"engine": {"extraArgs": ["--enforce-eager"]}}})
    st = await wait_status(driver, "llama", lambda s: s["rollout"]["targetRevision"] != old, "a new target")
    new = st["rollout"]["targetRevision"]
    await cluster.pair(new, **({"mode": "http500"} if breach else {}))
    for role in ("prefill", "decode"):
        await eventually(lambda: kube.get(STS, NAMESPACE, f"llama-{role}-{new}"), what=f"{role} of T")
        await kube.simulate_statefulset(NAMESPACE, f"llama-{role}-{new}", ip_prefix="10.2")
    return old, new


async def test_a_canary_walks_its_steps_and_promotes(kube: FakeKube, start_operator, cluster: Cluster):
    driver = FakeDriver(kube)
    driver.operator = await start_operator(reconcile=FAST)
    steps = [{"weight": 20, "pauseSeconds": 1}, {"weight": 50, "pauseSeconds": 1}]
    old, new = await start_canary(driver, cluster, steps)

    st = await wait_status(driver, "llama", lambda s: s["rollout"].get("phase") == "Progressing", "canary started")
    assert st["revision"] == old and st["rollout"]["strategy"] == "Canary" and st["rollout"]["canaryRevision"] == new
    assert (st["rollout"]["step"], st["rollout"]["weight"]) == (1, 20)
    assert condition(st, "RolloutProgressing")["status"] == "True" and condition(st, "Progressing")["reason"] == "Canary"
    await eventually(lambda: service_weights(kube, new) == {"20"}, what="the weight label at 20")
    template = router_template(kube)
    await eventually(lambda: new in cluster.answered[-200:], what="the router sending to T")

    seen_weights: list[int] = []

    def record(s: dict[str, Any]) -> bool:
        w = s["rollout"].get("weight")
        if not seen_weights or seen_weights[-1] != w:
            seen_weights.append(w)
        return s["rollout"].get("phase") == "Promoted"

    st = await wait_status(driver, "llama", record, "promoted", timeout=30)
    assert seen_weights[0] == 20 and 100 in seen_weights and seen_weights == sorted(seen_weights)
    assert "passed" in st["rollout"]["lastAnalysis"]
    await eventually(lambda: kube.get(CR_RESOURCE, NAMESPACE, "llama")["status"]["revision"] == new,
                     what="the switch to T")
    (adv,) = events(kube, "CanaryStepAdvanced")
    assert "step 2 of 2: 50%" in adv["message"]
    assert events(kube, "CanaryStarted") and events(kube, "CanaryPromoted")
    assert not events(kube, "CanaryAborted")
    # the router's pod template never changed: weights and the switch went through labels only
    assert router_template(kube) == template
    # the router split by the label: T took a share while the weight was 50, then everything
    await eventually(lambda: set(cluster.answered[-20:]) == {new}, what="every request on T")
    st = await wait_status(driver, "llama", lambda s: condition(s, "RolloutProgressing")["reason"] == "Promoted",
                           "RolloutProgressing Promoted")
    assert condition(st, "RolloutProgressing")["status"] == "False" and condition(st, "RolloutAborted")["status"] == "False"
    # the old pair is drained and deleted as in a paired rollout
    await eventually(lambda: kube.get(STS, NAMESPACE, f"llama-decode-{old}") is None, timeout=15, what="S deleted")


async def test_a_breach_aborts_with_condition_and_event(kube: FakeKube, start_operator, cluster: Cluster):
    driver = FakeDriver(kube)
    driver.operator = await start_operator(reconcile=FAST)
    steps = [{"weight": 30, "pauseSeconds": 1}, {"weight": 60, "pauseSeconds": 1}]
    old, new = await start_canary(driver, cluster, steps, breach=True, onAbort="Delete")
    st = await wait_status(driver, "llama", lambda s: s["rollout"].get("phase") == "Aborted", "aborted", timeout=30)
    assert st["revision"] == old and st["rollout"]["weight"] == 0 and st["rollout"]["step"] == 1
    assert "error rate" in st["rollout"]["lastAnalysis"] and "maxErrorRate 0.05" in st["rollout"]["lastAnalysis"]
    assert condition(st, "RolloutAborted")["status"] == "True"
    assert condition(st, "RolloutProgressing")["status"] == "False"
    (event,) = await eventually(lambda: events(kube, "CanaryAborted"), what="a CanaryAborted event")
    assert event["type"] == "Warning" and "error rate" in event["message"]
    assert not events(kube, "CanaryStepAdvanced") and not events(kube, "CanaryPromoted")
    # onAbort Delete: the new pair is removed; the router is back on S alone
    await eventually(lambda: kube.get(STS, NAMESPACE, f"llama-decode-{new}") is None, what="T deleted")
    decode_t = cluster.engines[new]["decode"]
    await asyncio.sleep(0.5)
    before = len(decode_t.received)
    await asyncio.sleep(0.5)
    assert len(decode_t.received) == before, "the router still sends to the aborted pair"
    assert set(cluster.answered[-20:]) == {old}
    # it stays aborted: no later reconcile starts the canary again
    await asyncio.sleep(0.5)
    st = (kube.get(CR_RESOURCE, NAMESPACE, "llama"))["status"]
    assert st["rollout"]["phase"] == "Aborted" and st["revision"] == old


async def test_an_operator_restart_mid_canary_converges(kube: FakeKube, start_operator, cluster: Cluster):
    driver = FakeDriver(kube)
    driver.operator = await start_operator(reconcile=FAST)
    steps = [{"weight": 25, "pauseSeconds": 3}, {"weight": 50, "pauseSeconds": 1}]
    old, new = await start_canary(driver, cluster, steps, onAbort="Keep")
    st = await wait_status(driver, "llama", lambda s: s["rollout"].get("phase") == "Progressing", "canary started")
    started = st["rollout"]["stepStartedAt"]
    template = router_template(kube)
    await driver.operator.astop()  # mid step 1 (its pause is 3 s)

    driver.operator = await start_operator(reconcile=FAST)
    step1_starts: set[str] = set()

    def promoted(s: dict[str, Any]) -> bool:
        if s["rollout"].get("step") == 1:
            step1_starts.add(s["rollout"]["stepStartedAt"])
        return s["rollout"].get("phase") == "Promoted"

    st = await wait_status(driver, "llama", promoted, "promoted", timeout=40)
    assert step1_starts <= {started}, "the restarted operator began step 1 again (its pause restarted)"
    assert st["rollout"]["canaryRevision"] == new
    adv = events(kube, "CanaryStepAdvanced")
    assert len(adv) == 1, [e["message"] for e in adv]  # step 1 -> 2 once, not again after the restart
    assert len(events(kube, "CanaryStarted")) == 1  # the new operator continued the canary, did not start over
    await eventually(lambda: kube.get(CR_RESOURCE, NAMESPACE, "llama")["status"]["revision"] == new, what="switch")
    assert router_template(kube) == template


async def test_the_annotation_promotes_and_a_left_over_value_does_not_promote_the_next_canary(
        kube: FakeKube, start_operator, cluster: Cluster):
    driver = FakeDriver(kube)
    driver.operator = await start_operator(reconcile=FAST)
    steps = [{"weight": 10, "pauseSeconds": 3600}]  # would hold for an hour
    old, new = await start_canary(driver, cluster, steps)
    await wait_status(driver, "llama", lambda s: s["rollout"].get("phase") == "Progressing", "canary started")
    await driver.patch_cr("llama", {"metadata": {"annotations": {labels.ROLLOUT: labels.ROLLOUT_PROMOTE}}})
    st = await wait_status(driver, "llama", lambda s: s["rollout"].get("phase") == "Promoted", "promoted by hand")
    assert "annotation" in st["rollout"]["lastAnalysis"]
    (event,) = await eventually(lambda: events(kube, "CanaryPromoted"), what="CanaryPromoted")
    assert labels.ROLLOUT in event["message"]
    await wait_status(driver, "llama", lambda s: s["revision"] == new, "the switch")

    # The annotation is still there (the operator does not write the resource): the next canary ignores it.
    await driver.patch_cr("llama", {"spec": {"engine": {"extraArgs": ["--enforce-eager", "--disable-log-stats"]}}})
    st = await wait_status(driver, "llama", lambda s: s["rollout"]["targetRevision"] not in (old, new), "a third")
    third = st["rollout"]["targetRevision"]
    await cluster.pair(third)
    for role in ("prefill", "decode"):
        await eventually(lambda: kube.get(STS, NAMESPACE, f"llama-{role}-{third}"), what=f"{role} of the third")
        await kube.simulate_statefulset(NAMESPACE, f"llama-{role}-{third}", ip_prefix="10.3")
    st = await wait_status(driver, "llama", lambda s: s["rollout"].get("canaryRevision") == third, "third canary")
    assert st["rollout"]["staleOverride"] == labels.ROLLOUT_PROMOTE
    await asyncio.sleep(1.0)
    st = kube.get(CR_RESOURCE, NAMESPACE, "llama")["status"]
    assert st["rollout"]["phase"] == "Progressing" and st["revision"] == new, st["rollout"]
    # set again (changed to abort): honoured
    await driver.patch_cr("llama", {"metadata": {"annotations": {labels.ROLLOUT: labels.ROLLOUT_ABORT}}})
    st = await wait_status(driver, "llama", lambda s: s["rollout"].get("phase") == "Aborted", "aborted by hand")
    assert st["revision"] == new and condition(st, "RolloutAborted")["status"] == "True"
    # onAbort Keep (the default): the aborted pair stays, with weight 0 on its Services
    assert kube.get(STS, NAMESPACE, f"llama-decode-{third}") is not None
    await eventually(lambda: service_weights(kube, third) == {"0"}, what="weight 0 on the aborted pair")


async def test_a_hand_made_router_pod_promotes_nothing_and_is_counted(kube: FakeKube, start_operator,
                                                                      cluster: Cluster, unused_tcp_port_factory):
    """Issue 30: a pod with the router's labels and no owner reports a million successful requests of
    the canary's revision per scrape; the real router sees the new pair fail every request. Before
    issue 30 the operator summed both pods' figures (error rate far below maxErrorRate: promoted);
    now it reads only the router its Deployment runs: the canary aborts, and the forged pod is counted
    in pdfleet_operator_unowned_objects_ignored_total{kind="Pod"} once."""
    driver = FakeDriver(kube)
    driver.operator = await start_operator(reconcile=FAST)
    scrapes = {"n": 0, "revision": ""}

    async def forged_metrics(request: web.Request) -> web.Response:
        scrapes["n"] += 1
        text = (f"# TYPE {metric_names.ROUTER_REVISION_REQUESTS} counter\n"
                f'{metric_names.ROUTER_REVISION_REQUESTS}_total{{revision="{scrapes["revision"]}",'
                f'{metric_names.REVISION_OUTCOME}="{metric_names.OUTCOME_ANSWERED}"}} {scrapes["n"] * 1e6}\n')
        return web.Response(text=text)

    app = web.Application()
    app.router.add_get("/metrics", forged_metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    forged_port = unused_tcp_port_factory()
    await web.TCPSite(runner, "127.0.0.1", forged_port).start()
    try:
        steps = [{"weight": 30, "pauseSeconds": 1}, {"weight": 60, "pauseSeconds": 1}]
        await cluster.forged_router_pod(forged_port)
        old, new = await start_canary(driver, cluster, steps, breach=True)
        scrapes["revision"] = new
        st = await wait_status(driver, "llama", lambda s: s["rollout"].get("phase") in ("Aborted", "Promoted"),
                               "the canary's verdict", timeout=30)
        assert st["rollout"]["phase"] == "Aborted", st["rollout"]
        assert st["revision"] == old and "error rate" in st["rollout"]["lastAnalysis"]
        assert not events(kube, "CanaryPromoted")
        assert scrapes["n"] == 0, "the operator scraped a pod its workloads do not run"
        metrics = driver.operator.runtime["metrics"]
        ignored = metrics.registry.get_sample_value("pdfleet_operator_unowned_objects_ignored_total", {"kind": "Pod"})
        assert ignored == 1.0, ignored  # once, not once per reconcile
        # neither does it count as a router replica, nor as an endpoint
        assert all(e["pod"] != "llama-router-abc12" for role in st["endpoints"].values() for e in role)
    finally:
        await runner.cleanup()


async def test_a_hand_edited_canary_weight_is_restored(kube: FakeKube, start_operator, cluster: Cluster):
    """Issue 30: someone who may patch the fleet's Services sets the canary pair's weight label to 100
    (the router would send every new request to an unproven pair). The applied-hash annotation is
    untouched; the next reconcile compares the labels it owns and puts the step's weight back."""
    driver = FakeDriver(kube)
    driver.operator = await start_operator(reconcile=FAST)
    old, new = await start_canary(driver, cluster, [{"weight": 10, "pauseSeconds": 3600}])
    await eventually(lambda: service_weights(kube, new) == {"10"}, what="the weight label at 10")
    name = f"llama-decode-{new}"
    svc = kube.get(SERVICES, NAMESPACE, name)
    edited = {**svc["metadata"]["labels"], labels.CANARY_WEIGHT: "100"}
    await kube.put(SERVICES, NAMESPACE, {**svc, "metadata": {**svc["metadata"], "labels": edited}})
    assert kube.get(SERVICES, NAMESPACE, name)["metadata"]["labels"][labels.CANARY_WEIGHT] == "100"
    await eventually(lambda: kube.get(SERVICES, NAMESPACE, name)["metadata"]["labels"][labels.CANARY_WEIGHT] == "10",
                     what="the weight label restored")
    assert kube.get(SERVICES, NAMESPACE, name)["metadata"]["annotations"] == svc["metadata"]["annotations"]
