"""Flow control keeps its bound through the gateway (issue 38): a real Envoy, the Endpoint Picker and
counting fake engines; no decode holds more than maxInFlightPerDecode requests at once, although the
gate lets a pipeline of requests through ahead of decode."""

from __future__ import annotations

import asyncio

import pytest
from counting_engine import counting

from pdfleet.connector.serving.flow.gate import FlowGate
from pdfleet.contract.flow_control import FlowControlConfig

pytestmark = pytest.mark.timeout(60)


async def _send(gw, n: int) -> list[int]:
    async def one(i: int) -> int:
        body = {"prompt": f"r{i}", "max_tokens": 2, "stream": True}
        async with gw.session.post(gw.url + "/v1/completions", json=body) as r:
            await r.read()
            return r.status
    async with asyncio.timeout(30):
        return list(await asyncio.gather(*(one(i) for i in range(n))))


@pytest.mark.parametrize("bounded", [
    True,
    False,  # negative control: the decode wait patched out (the gate before issue 38)
])
async def test_no_decode_holds_more_than_the_bound_through_the_gateway(gw, monkeypatch, bounded) -> None:
    if not bounded:
        async def no_wait(self, admission) -> None:
            return None
        monkeypatch.setattr(FlowGate, "wait_for_decode", no_wait)
    p = await counting(gw, "p0", "prefill", delay_s=0.3)  # prefill slower than decode: a full pipeline
    ds = [await counting(gw, f"d{i}", "decode", delay_s=0.2) for i in range(2)]
    await gw.start([p], ds, flow_control=FlowControlConfig(enabled=True, max_in_flight_per_decode=2,
                                                           max_queued=100, max_queue_s=20))
    assert await _send(gw, 4) == [200] * 4  # the gate learns the legs' times
    assert await _send(gw, 20) == [200] * 20
    assert p.most >= 5, "the pipeline let more than decode's capacity (4) through at once (the premise)"
    most = [d.most for d in ds]
    if bounded:
        assert max(most) <= 2, f"each decode held at most maxInFlightPerDecode at once: {most}"
    else:
        assert max(most) > 2, f"without the wait, the pipeline lands on decode: {most}"
