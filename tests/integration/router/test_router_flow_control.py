"""Flow control in the router (connector/serving/flow/), over real HTTP against fake engines on loopback:
admission, the order queued requests reach decode (priority, then tenants round robin), 429 shedding
with Retry-After in OpenAI's shape, queue timeouts, clients leaving while queued; none lost."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families
from counting_engine import counting
from router_fakes import FakeEngine  # noqa: F401  (the fixture's engines)
from waits import until

from pdfleet.connector.serving.flow.gate import FlowGate
from pdfleet.contract.flow_control import FlowControlConfig, Priority

pytestmark = pytest.mark.timeout(60)

TENANT, PRIO = "x-gateway-inference-fairness-id", "x-gateway-inference-objective"
CLASSES = (Priority("interactive", 8), Priority("batch", 1))


def flow(**kw) -> FlowControlConfig:
    return FlowControlConfig(**{"enabled": True, "max_in_flight_per_decode": 1, "priorities": CLASSES, **kw})


async def metrics(fleet, url) -> dict[tuple, float]:
    async with fleet.session.get(url + "/metrics") as resp:
        text = await resp.text()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("pdfleet_router_flow_"):
                out[(s.name, *sorted(s.labels.items()))] = s.value
    return out


def queued(m: dict[tuple, float]) -> float:
    return sum(v for k, v in m.items() if k[0] == "pdfleet_router_flow_queued")


class Client:
    """Sends named streaming requests and keeps what came back."""

    def __init__(self, fleet, url: str) -> None:
        self.fleet, self.url = fleet, url
        self.tasks: dict[str, asyncio.Task] = {}

    async def _send(self, name: str, headers: dict[str, str]) -> tuple[int, dict, bytes]:
        body = {"model": "tiny", "prompt": name, "max_tokens": 2, "stream": True}
        async with self.fleet.session.post(self.url + "/v1/completions", json=body, headers=headers) as resp:
            return resp.status, dict(resp.headers), await resp.read()

    def send(self, name: str, tenant: str | None = None, priority: str | None = None) -> asyncio.Task:
        headers = {k: v for k, v in ((TENANT, tenant), (PRIO, priority)) if v is not None}
        self.tasks[name] = asyncio.create_task(self._send(name, headers))
        return self.tasks[name]

    async def results(self) -> dict[str, tuple[int, dict, bytes]]:
        done = await asyncio.wait_for(asyncio.gather(*self.tasks.values()), 10)
        return dict(zip(self.tasks, done))


async def serve_in_turn(decode, count: int) -> None:
    """Let the decode fake finish its requests one at a time, as they reach it."""
    for k in range(count):
        await until(lambda: _ready(decode, k + 1), f"request {k + 1} at decode")
        decode.release.set()


async def _ready(decode, n: int) -> bool:
    return len(decode.received) >= n


def decode_order(decode) -> list[str]:
    return [r.body["prompt"] for r in decode.received]


async def queue_in_order(fleet, url, client, sends) -> None:
    """Send one at a time, each after the previous one is queued, so that arrival order is known."""
    for i, (name, tenant, prio) in enumerate(sends):
        client.send(name, tenant, prio)

        async def is_queued(n=i + 1):
            return queued(await metrics(fleet, url)) == n
        await until(is_queued, f"{name} queued")


# arrivals after `a1` (which takes the only slot): name, tenant, priority
ARRIVALS = [("a2", "a", "batch"), ("a3", "a", "batch"), ("a4", "a", "batch"), ("b1", "b", "batch"),
            ("c1", "c", None), ("h1", "a", "interactive")]


@pytest.mark.parametrize("enabled,expected", [
    (True, ["a1", "h1", "a2", "b1", "c1", "a3", "a4"]),  # priority first, then tenants round robin
    (False, ["a1", "a2", "a3", "a4", "b1", "c1", "h1"]),  # negative control: today's FIFO, arrival order
])
async def test_queued_requests_reach_decode_by_priority_then_round_robin(fleet, enabled, expected) -> None:
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", gated=True, chunks=2)
    url = await fleet.router([p], [d], flow_control=flow(enabled=enabled))
    client = Client(fleet, url)
    client.send("a1", "a", "batch")
    await until(lambda: _ready(d, 1), "a1 at decode")
    if enabled:
        await queue_in_order(fleet, url, client, ARRIVALS)
        assert len(d.received) == 1, "the gate holds the rest while a1 runs"
    else:
        for name, tenant, prio in ARRIVALS:
            client.send(name, tenant, prio)
            await until(lambda n=len(d.received) + 1: _ready(d, n), f"{name} at decode")
    await serve_in_turn(d, len(ARRIVALS) + 1)
    results = await client.results()
    assert decode_order(d) == expected
    assert {n: r[0] for n, r in results.items()} == {n: 200 for n in expected}
    assert all(r[2].rstrip().endswith(b"data: [DONE]") for r in results.values()), "every answer whole"
    m = await metrics(fleet, url)
    if enabled:
        assert m[("pdfleet_router_flow_admitted_total", ("priority", "batch"))] == 6  # c1: no header, lowest
        assert m[("pdfleet_router_flow_admitted_total", ("priority", "interactive"))] == 1
        assert m[("pdfleet_router_flow_queue_wait_seconds_count", ("priority", "batch"))] == 6
        assert queued(m) == 0 and m[("pdfleet_router_flow_in_flight",)] == 0
        # decode's one slot, plus (once decode legs were timed) a pipeline of at most as many ahead of it
        assert 1 <= m[("pdfleet_router_flow_capacity",)] <= 2
    else:
        assert m == {}, "disabled: no flow metrics at all"


async def test_a_full_queue_sheds_the_lowest_priority_with_429_and_retry_after(fleet) -> None:
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", gated=True, chunks=2)
    url = await fleet.router([p], [d], flow_control=flow(max_queued=2))
    client = Client(fleet, url)
    client.send("a1", "a", "batch")
    await until(lambda: _ready(d, 1), "a1 at decode")
    await queue_in_order(fleet, url, client, [("b1", "b", "batch"), ("c1", "c", "batch")])
    client.send("h1", "h", "interactive")  # full: displaces the newest of the longest batch flow (c1)
    status, headers, body = await asyncio.wait_for(client.tasks["c1"], 5)
    assert status == 429 and int(headers["Retry-After"]) >= 1
    error = __import__("json").loads(body)["error"]
    assert error["type"] == "rate_limit_exceeded" and error["code"] == 429 and "batch" in error["message"]
    client.send("d1", "d", "batch")  # queue [b1, h1]: its flow is as long as b1's, so it is refused itself
    status, headers, body = await asyncio.wait_for(client.tasks["d1"], 5)
    assert status == 429 and "holds 2 requests" in body.decode()
    await serve_in_turn(d, 3)
    results = await client.results()
    assert {n: r[0] for n, r in results.items()} == {"a1": 200, "b1": 200, "c1": 429, "h1": 200, "d1": 429}
    assert decode_order(d) == ["a1", "h1", "b1"], "shed requests never reach an engine"
    m = await metrics(fleet, url)
    shed = {k[2][1]: v for k, v in m.items() if k[0] == "pdfleet_router_flow_shed_total" and v}
    assert shed == {"displaced": 1, "queue_full": 1}
    assert sum(v for k, v in m.items() if k[0] == "pdfleet_router_flow_admitted_total") == 3
    async with fleet.session.get(url + "/metrics") as resp:
        assert 'pdfleet_router_requests_total{code="429",route="/v1/completions"} 2.0' in await resp.text()


async def test_a_request_queued_max_queue_seconds_is_shed(fleet) -> None:
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", gated=True, chunks=2)
    url = await fleet.router([p], [d], flow_control=flow(max_queue_s=0.3))
    client = Client(fleet, url)
    client.send("a1", "a")
    await until(lambda: _ready(d, 1), "a1 at decode")
    started = asyncio.get_running_loop().time()
    status, headers, body = await asyncio.wait_for(client.send("a2", "a"), 5)
    waited = asyncio.get_running_loop().time() - started
    assert status == 429 and b"waited 0.3 s" in body and 0.3 <= waited < 2.0
    d.release.set()
    assert (await client.results())["a1"][0] == 200
    m = await metrics(fleet, url)
    assert m[("pdfleet_router_flow_shed_total", ("priority", "batch"), ("reason", "queue_timeout"))] == 1


async def test_a_client_that_leaves_while_queued_frees_its_place(fleet) -> None:
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", gated=True, chunks=2)
    url = await fleet.router([p], [d], flow_control=flow())
    client = Client(fleet, url)
    client.send("a1", "a")
    await until(lambda: _ready(d, 1), "a1 at decode")
    await queue_in_order(fleet, url, client, [("a2", "a", None), ("a3", "a", None)])
    client.tasks.pop("a2").cancel()

    async def abandoned():
        m = await metrics(fleet, url)
        return m.get(("pdfleet_router_flow_abandoned_total", ("priority", "batch"))) == 1 and queued(m) == 1
    await until(abandoned, "a2 withdrawn")
    await serve_in_turn(d, 2)
    results = await client.results()
    assert {n: r[0] for n, r in results.items()} == {"a1": 200, "a3": 200}
    assert decode_order(d) == ["a1", "a3"]
    m = await metrics(fleet, url)
    assert m[("pdfleet_router_flow_in_flight",)] == 0 and queued(m) == 0


async def test_capacity_follows_the_ready_decode_endpoints_with_headroom_for_the_top_class(fleet) -> None:
    p = await fleet.engine("p0", "prefill")
    ds = [await fleet.engine(f"d{i}", "decode", gated=True, chunks=2) for i in range(2)]
    url = await fleet.router([p], ds, flow_control=flow(max_in_flight_per_decode=2))
    client = Client(fleet, url)
    for i in range(5):
        client.send(f"r{i}", "a", "batch")

    async def running(n: int, waiting: int):
        return sum(len(d.received) for d in ds) == n and queued(await metrics(fleet, url)) == waiting
    # capacity 2 x 2 decodes = 4; batch leaves one slot (headroom) to the top class
    await until(lambda: running(3, 2), "3 batch requests running, 2 queued")
    client.send("h", "b", "interactive")
    await until(lambda: running(4, 2), "the interactive one running at once")
    m = await metrics(fleet, url)
    assert m[("pdfleet_router_flow_capacity",)] == 4 and m[("pdfleet_router_flow_in_flight",)] == 4
    for _ in range(10):
        for d in ds:
            d.release.set()
        await asyncio.sleep(0.05)
    results = await client.results()
    assert [r[0] for r in results.values()] == [200] * 6


@pytest.mark.parametrize("bounded", [
    True,
    False,  # negative control: the decode wait patched out (the gate before issue 38)
])
async def test_decode_never_holds_more_than_max_in_flight_per_decode(fleet, monkeypatch, bounded) -> None:
    """Prefill slower than decode: the gate lets a pipeline as large as decode's capacity through
    ahead of decode (capacity 2 decodes x 2 = 4, 8 admitted), and their prefill legs end together."""
    if not bounded:
        async def no_wait(self, admission) -> None:
            return None
        monkeypatch.setattr(FlowGate, "wait_for_decode", no_wait)
    p = await counting(fleet, "p0", "prefill", delay_s=0.3)
    ds = [await counting(fleet, f"d{i}", "decode", delay_s=0.2) for i in range(2)]
    url = await fleet.router([p], ds, flow_control=flow(max_in_flight_per_decode=2, priorities=()))
    client = Client(fleet, url)
    for i in range(4):  # the gate learns the legs' times: a pipeline from now on
        client.send(f"w{i}", "a")
    await client.results()
    client.tasks.clear()
    for i in range(20):
        client.send(f"r{i}", f"t{i % 3}")
    results = await client.results()
    assert [r[0] for r in results.values()] == [200] * 20
    assert p.most >= 5, "the pipeline let more than decode's capacity through at once (the premise)"
    most = [d.most for d in ds]
    if bounded:
        assert max(most) <= 2, f"each decode held at most maxInFlightPerDecode at once: {most}"
        m = await metrics(fleet, url)
        assert m[("pdfleet_router_flow_decode_wait_seconds_count", ("priority", "default"))] == 24
        assert m[("pdfleet_router_flow_in_decode",)] == 0
    else:
        assert max(most) > 2, f"without the wait, the pipeline lands on decode: {most}"


async def test_waiting_for_decode_past_max_queue_seconds_is_a_429_and_gives_the_lease_back(fleet) -> None:
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", gated=True, chunks=2)
    url = await fleet.router([p], [d], flow_control=flow(max_queue_s=0.3, priorities=()))
    client = Client(fleet, url)
    d.release.set()
    assert (await client.send("w", "a"))[0] == 200  # teaches the gate its legs' times: a pipeline of one
    client.send("a1", "a")
    await until(lambda: _ready(d, 2), "a1 at decode, holding its only slot")
    status, headers, body = await asyncio.wait_for(client.send("a2", "a"), 5)  # admitted, prefilled, waits
    assert status == 429 and int(headers["Retry-After"]) >= 1 and b"decode slot" in body
    await until(lambda: len(p.released) == 1, "a2's prefill lease given back")
    assert decode_order(d) == ["w", "a1"], "a2 never reached decode"
    m = await metrics(fleet, url)
    assert m[("pdfleet_router_flow_shed_total", ("priority", "default"), ("reason", "queue_timeout"))] == 1
    d.release.set()
    assert (await client.results())["a1"][0] == 200
