"""The router's SLO metrics on a real stream (real aiohttp router and fake engines over loopback),
read back through the operator's own parser, as the planner reads them."""

from __future__ import annotations

import asyncio

from router_fakes import FakeEngine  # noqa: F401  (the fixture's engines)

from pdfleet.operator.autoscale.signals import interval_signals, parse_router_metrics

COMPLETION = {"model": "tiny", "prompt": "hello there", "max_tokens": 7, "temperature": 0, "stream": True}
GAP_S = 0.15


async def scrape(fleet, url):
    async with fleet.session.get(url + "/metrics") as resp:
        return parse_router_metrics(await resp.text())


async def test_ttft_itl_waiting_and_streams_on_a_real_stream(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", gated=True, chunks=3)
    url = await fleet.router([p], [d])
    before = await scrape(fleet, url)
    async with fleet.session.post(url + "/v1/completions", json=COMPLETION) as resp:
        assert resp.status == 200
        await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
        during = await scrape(fleet, url)
        assert during.streams == 1 and during.decode_waiting == 0 and during.prefill_waiting == 0
        for _ in range(2):
            await asyncio.sleep(GAP_S)
            d.release.set()
            await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)
        await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 5)   # [DONE]
    await asyncio.sleep(0.05)
    after = await scrape(fleet, url)
    assert after.streams == 0 and after.decode_waiting == 0 and after.prefill_waiting == 0
    assert after.ttft[float("inf")] == 1
    assert after.itl[float("inf")] == 3, "three gaps: t0->t1, t1->t2, t2->[DONE]"
    sig = interval_signals({"r": before}, {"r": after})
    assert sig["prefill"].p90_s is not None and sig["prefill"].p90_s < GAP_S, "TTFT is before the gated chunks"
    # one gap, not their sum (0.45 s); a loaded machine may add tens of ms to a gap
    assert GAP_S * 0.9 <= sig["decode"].p90_s <= 2 * GAP_S, sig


async def test_waiting_counts_a_decode_that_has_not_answered(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", mode="hang")
    url = await fleet.router([p], [d], decode_first_byte_timeout_s=5.0)
    task = asyncio.create_task(fleet.session.post(url + "/v1/completions", json=dict(COMPLETION, stream=False)))
    for _ in range(100):
        s = await scrape(fleet, url)
        if s.decode_waiting == 1:
            break
        await asyncio.sleep(0.02)
    assert s.decode_waiting == 1 and s.streams == 0
    task.cancel()
