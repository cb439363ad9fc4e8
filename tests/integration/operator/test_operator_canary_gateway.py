"""A canary served through the Gateway (issue 38): the real kopf operator against FakeKube, a real Envoy
in front of pdfleet's Endpoint Picker (EndpointSlice discovery through the same API server), fake
engines of two revision pairs, and a client load through Envoy. No router serves: the canary is
judged on the series the gateway path wrote, which the operator reads from the Endpoint Picker's pod.

Negative control: before the serving pipeline was shared, the Endpoint Picker wrote no per-revision
series and the operator read router pods only; this canary then never aborted ("waiting: no router
metrics"), and the test below timed out on the Aborted phase."""

from __future__ import annotations

import asyncio
import secrets
import urllib.parse

import pytest
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import FakeKube, eventually
from operator_scenarios import STS, condition, wait_status
from test_operator_canary import FAST, Cluster, events, start_canary

from pdfleet.connector.epp.envoy_config import BUFFERED, render
from pdfleet.connector.epp.envoy_process import Envoy
from pdfleet.connector.epp.server import EndpointPicker
from pdfleet.contract.ports import HTTP_NAME

pytestmark = pytest.mark.timeout(90)
DEPLOY = "apps/v1/deployments"
GATEWAY = {"gateway": {"inferencePool": {"enabled": True, "failureMode": "FailClose", "eppReplicas": 1,
                                         "allowFrom": [{"namespaceSelector": {"matchLabels": {"gw": "yes"}}}]}},
           "router": {"replicas": 1, "enabled": False}}


class GatewayCluster(Cluster):
    """The test_operator_canary cluster with the Gateway as the front door: Envoy -> the EPP."""

    epp: EndpointPicker | None = None
    envoy: Envoy | None = None

    async def router_pod(self) -> None:
        """The EPP Deployment's pod as Kubernetes makes it; its /metrics port is this test's EPP's."""
        await eventually(lambda: self.kube.get(DEPLOY, NAMESPACE, "llama-epp"), what="the EPP Deployment")
        self.epp_pods = await self.kube.simulate_deployment(NAMESPACE, "llama-epp", pods=True, ip="127.0.0.1")

    async def start_router(self, fleet_uid: str) -> None:
        token = secrets.token_hex(32)
        self.epp = EndpointPicker(self.router_config(fleet_uid), caller_token=token)
        epp_port = await self.epp.start("127.0.0.1", 0, metrics_port=0)
        metrics_port = urllib.parse.urlsplit(self.epp.metrics_url).port
        for pod in self.epp_pods:  # the kubelet's part: the pod's HTTP port is where this EPP serves /metrics
            for c in pod["spec"]["containers"]:
                c["ports"] = [dict(p, containerPort=metrics_port) if p.get("name") == HTTP_NAME else p
                              for p in c.get("ports", [])]
            await self.kube.put("v1/pods", NAMESPACE, pod)
        self.envoy = Envoy(render(BUFFERED, listen_port=0, epp_port=epp_port, admin_port=0, caller_token=token,
                                  message_timeout_s=10.0, connect_timeout_s=1.0))
        await asyncio.to_thread(self.envoy.start)
        self.port = self.envoy.listener_port()  # the load goes through Envoy

    async def close(self) -> None:
        await super().close()
        if self.envoy is not None:
            await asyncio.to_thread(self.envoy.stop)
        if self.epp is not None:
            await self.epp.stop(grace=0)


@pytest.fixture
async def gateway_cluster(kube: FakeKube, tmp_path):
    c = GatewayCluster(kube, tmp_path)
    try:
        yield c
    finally:
        await c.close()


async def test_a_canary_behind_the_gateway_whose_decode_fails_is_aborted(kube: FakeKube, start_operator,
                                                                        gateway_cluster: GatewayCluster):
    driver = FakeDriver(kube)
    driver.operator = await start_operator(reconcile=FAST)
    steps = [{"weight": 30, "pauseSeconds": 1}, {"weight": 60, "pauseSeconds": 1}]
    old, new = await start_canary(driver, gateway_cluster, steps, breach=True, onAbort="Delete", spec=GATEWAY)
    st = await wait_status(driver, "llama", lambda s: s["rollout"].get("phase") == "Aborted", "aborted", timeout=40)
    assert st["revision"] == old and st["rollout"]["weight"] == 0
    assert "error rate" in st["rollout"]["lastAnalysis"], st["rollout"]["lastAnalysis"]
    assert condition(st, "RolloutAborted")["status"] == "True"
    (event,) = await eventually(lambda: events(kube, "CanaryAborted"), what="a CanaryAborted event")
    assert "error rate" in event["message"]
    # the failures the analysis counted are the gateway's own: T's decode answered 5xx through Envoy
    assert gateway_cluster.engines[new]["decode"].received
    await eventually(lambda: kube.get(STS, NAMESPACE, f"llama-decode-{new}") is None, what="T deleted")
