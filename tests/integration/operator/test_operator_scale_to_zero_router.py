"""Scale to zero through a real router (issue 41): the kopf loop over FakeKube reads the real router's waiting
room from its /metrics and wakes the pair; the test plays the StatefulSet and EndpointSlice controllers (the pair
is published to the router's discovery once both scalers are at 1, and taken away once they are at 0).

A burst held at zero is served once the pair is up, each request once per role (0 lost, 0 duplicated, none
decode-alone); idle, the pair retires; a request that arrives after the retirement is held, wakes the pair again
and is served. Negative control: nothing is written while nothing is held."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from fake_env import NAMESPACE, FakeDriver
from kube_fixture import FakeKube, eventually
from operator_scenarios import make_fleet_ready, wait_status
from router_fakes import FakeEngine  # noqa: E402
from test_operator_scale_to_zero import OPTIONS, events, pair, pair_fleet, scale_writes  # noqa: E402
from waiting_room_checks import COMPLETION, Publisher, generate_calls  # noqa: E402

from pdfleet.connector.router.app import start_router
from pdfleet.contract import scale_to_zero as stz
from pdfleet.contract.routing import FALLBACK_HEADER
from pdfleet.contract.router_config import RouterConfig

pytestmark = pytest.mark.timeout(90)
BURST = 20


async def post(session: aiohttp.ClientSession, url: str, rid: str) -> tuple[int, Any, bytes]:
    async with session.post(url + "/v1/completions", json=COMPLETION, headers={"X-Request-Id": rid}) as resp:
        return resp.status, resp.headers.copy(), await resp.read()


async def test_held_requests_wake_the_pair_and_are_served_across_a_retirement(kube: FakeKube, start_operator):
    p, d = FakeEngine(name="p0", role="prefill"), FakeEngine(name="d0", role="decode")
    await p.start()
    await d.start()
    pub = Publisher()
    config = RouterConfig(prefill=(p.url,), decode=(d.url,), scale_to_zero_max_waiting=50,
                          scale_to_zero_activation_timeout_s=30)
    runner, port = await start_router(config, "127.0.0.1", 0, discovery=pub)
    session = aiohttp.ClientSession()
    try:
        await asyncio.wait_for(pub.started.wait(), 5)
        driver = FakeDriver(kube)
        driver.operator = await start_operator(reconcile=OPTIONS)
        await driver.create_cr(pair_fleet(port, replicas=0, idle_seconds=2))
        await eventually(lambda: kube.get("apps/v1/deployments", NAMESPACE, "llama-router"), what="the router")
        await kube.simulate_deployment(NAMESPACE, "llama-router", pods=True, ip="127.0.0.1")
        await eventually(lambda: pair(kube) == (0, 0), what="both scalers at 0")
        await make_fleet_ready(driver, "llama")
        await asyncio.sleep(1.0)
        assert scale_writes(kube) == [], "negative control: nothing held, nothing written"

        # A burst at zero: held by the router's waiting room; the operator reads the gauge and wakes both roles.
        ids = [f"held-{i}" for i in range(BURST)]
        tasks = [asyncio.create_task(post(session, f"http://127.0.0.1:{port}", rid)) for rid in ids]
        await pub.until_waiting(BURST)
        await eventually(lambda: pair(kube) == (1, 1), timeout=10, what="both scalers 0 -> 1")
        assert sorted(c.name for c in scale_writes(kube)) == ["llama-decode", "llama-prefill"]
        assert not any(t.done() for t in tasks) and not p.received and not d.received
        pub.publish([p], [d])   # the pods came up: both roles' EndpointSlices are ready
        answers = await asyncio.wait_for(asyncio.gather(*tasks), 30)
        assert [s for s, _, _ in answers] == [200] * BURST
        assert all(FALLBACK_HEADER not in h for _, h, _ in answers), "none answered decode-alone"
        assert all(json.loads(raw)["kv_seen"] for _, _, raw in answers)
        for engine in (p, d):   # 0 lost, 0 duplicated
            assert sorted(r.headers["X-Request-Id"] for r in generate_calls(engine)) == sorted(ids)

        # Idle for idleSeconds: both to 0 together; the pods leave the router's discovery.
        await eventually(lambda: pair(kube) == (0, 0), timeout=15, what="retired")
        await eventually(lambda: len(events(kube, "PairRetired")) == 1, what="a PairRetired event")
        pub.state.set_endpoints([])
        # A request after the retirement is held, wakes the pair again, and is served.
        late = asyncio.create_task(post(session, f"http://127.0.0.1:{port}", "late"))
        await pub.until_waiting(1)
        await eventually(lambda: pair(kube) == (1, 1), timeout=10, what="woken again")
        assert not late.done()
        pub.publish([p], [d])
        status, headers, _ = await asyncio.wait_for(late, 30)
        assert status == 200 and FALLBACK_HEADER not in headers
        assert [r.headers["X-Request-Id"] for r in generate_calls(d)].count("late") == 1
        await eventually(lambda: len(events(kube, "PairActivated")) == 2, what="two PairActivated events")
        assert pub.sample(stz.ROUTER_ACTIVATIONS + "_total") == 2
        await wait_status(driver, "llama", lambda s: s.get("scaling", {}).get("decode", {}).get("replicas") == 1,
                          "the status at 1")
    finally:
        await session.close()
        await runner.cleanup()
        await p.stop()
        await d.stop()
