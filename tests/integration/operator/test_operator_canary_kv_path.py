"""The canary under a broken KV path (issue 31), in the real kopf loop against FakeKube with a real router
in front of fake engines (the pattern and helpers of test_operator_canary.py).

The new pair's decode answers 200 to every request but refuses the prefill's kv_transfer_params, as a
decode whose connector rejects them does: it computes every prompt itself. Its /metrics (the scrape the
operator makes of the new revision's decode pods) count each refused request under the connector's
exported name, ``vllm:pdfleet_connector_params_rejected_total``; a healthy decode counts pulls
instead. No request is answered 5xx, so only maxRecomputeRate can catch it."""

from __future__ import annotations

from typing import Any, Optional

import pytest
from aiohttp import web
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import FakeKube, eventually
from operator_scenarios import CR_RESOURCE, condition, wait_status
from prometheus_client import CollectorRegistry, Counter, generate_latest
from test_operator_canary import FAST, Cluster, cluster, events, start_canary  # noqa: F401 (cluster: a fixture)

from pdfleet.connector.adapter.metric_names import exported_name

pytestmark = pytest.mark.timeout(90)


class DecodeMetrics:
    """The /metrics of the new revision's decode pod: its connector's counters, from what it received."""

    def __init__(self, cluster: Cluster, revision: str, refuses: bool):
        self.cluster, self.revision, self.refuses = cluster, revision, refuses
        self.scrapes = 0
        self.runner: Optional[web.AppRunner] = None
        self.port = 0

    async def metrics(self, request: web.Request) -> web.Response:
        self.scrapes += 1
        decode = self.cluster.engines[self.revision]["decode"]
        with_kv = sum(1 for r in decode.received if r.body and r.body.get("kv_transfer_params"))
        registry = CollectorRegistry()
        pulls = Counter(exported_name("transfers"), "h", ["engine"], registry=registry)
        rejected = Counter(exported_name("params_rejected"), "h", ["engine"], registry=registry)
        (rejected if self.refuses else pulls).labels("0").inc(with_kv)
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


async def point_decode_pod_at(kube: FakeKube, revision: str, port: int) -> None:
    """The new decode pod's IP and http port lead to its /metrics (the kubelet would give it a real IP)."""
    name = f"llama-decode-{revision}-0"
    pod = kube.get("v1/pods", NAMESPACE, name)
    for c in pod["spec"]["containers"]:
        for p in c.get("ports") or []:
            if p.get("name") == "http":
                p["containerPort"] = port
    pod["status"] = {**pod["status"], "podIP": "127.0.0.1", "podIPs": [{"ip": "127.0.0.1"}]}
    await kube.put("v1/pods", NAMESPACE, pod)


CASES = [
    # (case, the new decode refuses the params, maxRecomputeRate, the canary's end)
    ("every request recomputed, limit 0.1: aborted", True, 0.1, "Aborted"),
    ("every request recomputed, no limit: promoted (negative control)", True, None, "Promoted"),
    ("a healthy KV path, limit 0.1: promoted", False, 0.1, "Promoted"),
]


@pytest.mark.parametrize("case,refuses,limit,end", CASES, ids=[c[0] for c in CASES])
async def test_a_pair_that_recomputes_every_request_is_aborted_by_the_analysis(
        kube: FakeKube, start_operator, cluster: Cluster, case: str, refuses: bool, limit: Optional[float],
        end: str) -> None:
    driver = FakeDriver(kube)
    driver.operator = await start_operator(reconcile=FAST)
    analysis: dict[str, Any] = {"maxErrorRate": 0.05, "ttftMs": 5000, "minRequests": 15}
    if limit is not None:
        analysis["maxRecomputeRate"] = limit
    steps = [{"weight": 30, "pauseSeconds": 1}, {"weight": 60, "pauseSeconds": 1}]
    old, new = await start_canary(driver, cluster, steps, analysis=analysis, onAbort="Keep")
    decode_metrics = DecodeMetrics(cluster, new, refuses)
    await decode_metrics.start()
    try:
        await point_decode_pod_at(kube, new, decode_metrics.port)
        st = await wait_status(driver, "llama", lambda s: s["rollout"].get("phase") in ("Aborted", "Promoted"),
                               "the canary's end", timeout=40)
        assert st["rollout"]["phase"] == end, st["rollout"]
        # the new pair answered 200: its decode got the prefill's params, the router saw no 5xx
        decode = cluster.engines[new]["decode"]
        assert any(r.body and r.body.get("kv_transfer_params") for r in decode.received)
        assert new in cluster.answered
        if end == "Aborted":
            assert st["revision"] == old and st["rollout"]["weight"] == 0
            assert "recompute rate 1.000 > maxRecomputeRate 0.1" in st["rollout"]["lastAnalysis"]
            assert condition(st, "RolloutAborted")["status"] == "True"
            (event,) = await eventually(lambda: events(kube, "CanaryAborted"), what="a CanaryAborted event")
            assert event["type"] == "Warning" and "recompute rate" in event["message"]
        else:
            assert not events(kube, "CanaryAborted")
            await eventually(lambda: kube.get(CR_RESOURCE, NAMESPACE, "llama")["status"]["revision"] == new,
                             what="the switch to the new pair")
        if limit is None:
            assert decode_metrics.scrapes == 0  # without the limit, decodes are not read
            assert "recompute rate" not in st["rollout"]["lastAnalysis"]
        else:
            assert decode_metrics.scrapes > 0
            if end == "Promoted":
                assert "recompute rate 0.000" in st["rollout"]["lastAnalysis"], st["rollout"]
    finally:
        await decode_metrics.stop()
