"""The fleet says whether prefix routing has the model's tokenizer (issue 39): the real kopf loop over
FakeKube reads the router pod's /metrics (pdfleet_router_tokenizer_loaded) into the PrefixRouting
condition. Negative controls: before a router pod is ready the condition is Unknown (NotRead), and a pod
that only carries the router's labels (no owner) is never read."""

from __future__ import annotations

import pytest
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import FakeKube
from metrics_page import metrics_page  # noqa: E402
from operator_scenarios import DEPLOY, IMAGE, condition, fleet, wait_status

from pdfleet.contract import metrics as names
from pdfleet.operator.reconcile.reconciler import ReconcileOptions

pytestmark = pytest.mark.timeout(60)
FAST = ReconcileOptions(default_image=IMAGE, prefix_routing_interval_s=0.2)


def page(reason: str) -> str:
    value = 1 if reason == names.TOKENIZER_LOADED else 0
    return (f"# TYPE {names.ROUTER_TOKENIZER_LOADED} gauge\n"
            f'{names.ROUTER_TOKENIZER_LOADED}{{{names.TOKENIZER_REASON}="{reason}"}} {value}\n')


@pytest.fixture
async def router_metrics(unused_tcp_port: int):
    state = {"reason": names.TOKENIZER_NOT_FOUND}
    async with metrics_page(unused_tcp_port, lambda: page(state["reason"])):
        yield unused_tcp_port, state


async def test_the_router_pods_tokenizer_state_is_the_fleets_prefix_routing_condition(kube: FakeKube, start_operator,
                                                                                      router_metrics):
    port, state = router_metrics
    driver = FakeDriver(kube)
    driver.operator = await start_operator(reconcile=FAST)
    await driver.create_cr(fleet(router={"replicas": 1, "port": port}))
    st = await wait_status(driver, "llama", lambda s: condition(s, "PrefixRouting"), "PrefixRouting")
    assert (condition(st, "PrefixRouting")["status"], condition(st, "PrefixRouting")["reason"]) == ("Unknown",
                                                                                                   "NotRead")
    await kube.simulate_deployment(NAMESPACE, "llama-router", pods=True, ip="127.0.0.1")
    st = await wait_status(driver, "llama", lambda s: condition(s, "PrefixRouting")["status"] == "False",
                           "PrefixRouting False")
    cond = condition(st, "PrefixRouting")
    assert cond["reason"] == names.TOKENIZER_NOT_FOUND and "meta-llama/Llama-3.1-8B" in cond["message"], cond
    state["reason"] = names.TOKENIZER_LOADED  # the router loaded it (a PVC mounted, a token Secret added)
    st = await wait_status(driver, "llama", lambda s: condition(s, "PrefixRouting")["status"] == "True",
                           "PrefixRouting True")
    assert condition(st, "PrefixRouting")["reason"] == names.TOKENIZER_LOADED
    assert kube.get(DEPLOY, NAMESPACE, "llama-router") is not None
