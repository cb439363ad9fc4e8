"""The waiting room through the router (issue 41): a real router over real HTTP, counting fake engines, and a
discovery the test drives from zero (tests/support/waiting_room_checks.py: the same checks as the gateway's)."""

from __future__ import annotations

import asyncio

from waiting_room_checks import COMPLETION, Publisher, burst_is_held_then_served, expired_wait_is_answered

from pdfleet.contract import scale_to_zero as stz


async def router(fleet, pub: Publisher, **overrides) -> tuple[str, object, object]:
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d], discovery=pub, **overrides)
    await asyncio.wait_for(pub.started.wait(), 5)
    return url, p, d


def poster(fleet, url: str):
    async def post(body, headers):
        async with fleet.session.post(url + "/v1/completions", json=body, headers=headers) as resp:
            return resp.status, resp.headers.copy(), await resp.read()
    return post


async def health(fleet, url: str) -> tuple[int, str]:
    async with fleet.session.get(url + "/health") as resp:
        return resp.status, (await resp.json())["status"]


async def test_a_burst_at_zero_is_held_and_served_once_the_pair_is_ready(fleet):
    pub = Publisher()
    url, p, d = await router(fleet, pub, scale_to_zero_max_waiting=50)
    assert await health(fleet, url) == (200, "waiting")  # stays in its Service (and scraped) at zero
    await burst_is_held_then_served(poster(fleet, url), pub, [p], [d], n=20)
    assert await health(fleet, url) == (200, "ok")


async def test_no_endpoint_in_time_is_a_503_with_the_reason(fleet):
    pub = Publisher()
    url, _, _ = await router(fleet, pub, scale_to_zero_max_waiting=5, scale_to_zero_activation_timeout_s=0.3)
    await expired_wait_is_answered(poster(fleet, url), pub, 503, stz.REJECTED_NO_ENDPOINTS)


async def test_endpoints_up_without_a_pair_in_time_is_a_429_with_retry_after(fleet):
    pub = Publisher()
    url, p, d = await router(fleet, pub, scale_to_zero_max_waiting=5, scale_to_zero_activation_timeout_s=0.3)
    pub.publish([p], [d], prefill_ready=False)  # decode up, prefill never comes
    await expired_wait_is_answered(poster(fleet, url), pub, 429, stz.REJECTED_TTL_EXPIRED)
    assert not d.received, "not served decode-alone"


async def test_a_full_room_refuses_at_once_and_a_client_that_leaves_frees_its_place(fleet):
    pub = Publisher()
    url, p, d = await router(fleet, pub, scale_to_zero_max_waiting=2)
    post = poster(fleet, url)
    first = asyncio.create_task(post(COMPLETION, {}))
    second = asyncio.create_task(post(COMPLETION, {}))
    await pub.until_waiting(2)
    status, headers, _ = await asyncio.wait_for(post(COMPLETION, {}), 5)
    assert (status, headers.get(stz.DROPPED_REASON_HEADER)) == (503, stz.REJECTED_WAITING_ROOM_FULL)
    first.cancel()  # its client leaves
    await pub.until_waiting(1)
    third = asyncio.create_task(post(COMPLETION, {}))
    await pub.until_waiting(2)
    pub.publish([p], [d])
    assert [s for s, _, _ in await asyncio.wait_for(asyncio.gather(second, third), 10)] == [200, 200]
    assert len(d.received) == 2  # the one that left was never served


async def test_negative_control_the_room_off_answers_503_at_once(fleet):
    pub = Publisher()
    url, _, _ = await router(fleet, pub)  # scale_to_zero_max_waiting=0 (the default)
    status, headers, _ = await asyncio.wait_for(poster(fleet, url)(COMPLETION, {}), 5)
    assert status == 503 and stz.DROPPED_REASON_HEADER not in headers
    assert pub.sample(stz.ROUTER_WAITING_REQUESTS) == 0 and pub.sample(stz.ROUTER_ACTIVATIONS + "_total") == 0
    assert await health(fleet, url) == (503, "unavailable")
