"""Every path where the router gives up on decode after prefill answered releases prefill's lease at
that prefill (issue 20 row 6, second half): real router, fake engines over real HTTP; the fake prefill
checks release requests with the connector's own function (own_lease_to_release)."""

from __future__ import annotations

import asyncio

import pytest

from pdfleet.connector.router.app import ROUTER_KEY
from pdfleet.contract import metrics as names

pytestmark = pytest.mark.timeout(30)

COMPLETION = {"model": "tiny", "prompt": "hello", "max_tokens": 4}


def releases(router, reason=None, outcome=None) -> float:
    total = 0.0
    for metric in router.metrics.registry.collect():
        for s in metric.samples:
            if s.name == names.ROUTER_KV_RELEASES + "_total" and (reason is None or s.labels["reason"] == reason) \
                    and (outcome is None or s.labels["outcome"] == outcome):
                total += s.value
    return total


async def start(fleet, prefill, decode, **kw):
    url = await fleet.router(prefill, decode, **kw)
    return url, fleet.runners[-1].app[ROUTER_KEY]


async def post(fleet, url, body=COMPLETION, rid="req-1"):
    async with fleet.session.post(url + "/v1/completions", json=body, headers={"X-Request-Id": rid}) as r:
        return r.status, await r.read()


@pytest.mark.parametrize("mode, status", [("http500", 502), ("hang", 502)])
async def test_decode_failing_everywhere_releases_the_lease(fleet, mode, status):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", mode=mode)
    url, router = await start(fleet, [p], [d], decode_first_byte_timeout_s=0.5)
    assert (await post(fleet, url))[0] == status
    await router.releases.settle()
    assert p.released == ["req-1"]  # the fake's remote_request_id is the X-Request-Id
    assert releases(router, "decode_failed", "accepted") == 1
    # the release went to the prefill as a one-token completion carrying its own params
    rel = p.received[-1].body
    assert rel["max_tokens"] == 1 and rel["kv_transfer_params"]["remote_engine_id"] == "p0"


async def test_no_decode_reachable_releases_the_lease(fleet):
    p = await fleet.engine("p0", "prefill")
    url, router = await start(fleet, [p], ["http://127.0.0.1:9"])  # nothing listens there
    assert (await post(fleet, url))[0] == 502
    await router.releases.settle()
    assert p.released == ["req-1"] and releases(router, "decode_failed", "accepted") == 1


async def test_decode_4xx_releases_the_lease_and_relays_the_error(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", mode="http400")
    url, router = await start(fleet, [p], [d])
    status, data = await post(fleet, url)
    assert status == 400 and b"bad prompt" in data
    await router.releases.settle()
    assert p.released == ["req-1"] and releases(router, "decode_refused", "accepted") == 1


async def test_client_gone_before_decode_answered_releases_the_lease(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", mode="hang")
    url, router = await start(fleet, [p], [d], decode_first_byte_timeout_s=20)
    task = asyncio.create_task(post(fleet, url))
    for _ in range(200):
        if d.received:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    for _ in range(200):
        if releases(router):
            break
        await asyncio.sleep(0.01)
    await router.releases.settle()
    assert p.released == ["req-1"] and releases(router, "client_gone", "accepted") == 1


async def test_retry_without_the_expiring_lease_releases_it(fleet):
    p = await fleet.engine("p0", "prefill", lease_s=2.0)
    bad = await fleet.engine("d0", "decode", mode="http500")
    good = await fleet.engine("d1", "decode")
    url, router = await start(fleet, [p], [bad, good], lease_margin_s=5.0, decode_attempts=2)
    for rid in ("a", "b", "c"):  # least-outstanding rotates: one of them tries d0 first
        assert (await post(fleet, url, rid=rid))[0] == 200
    await router.releases.settle()
    retried = [r for r in ("a", "b", "c") if any(x.headers["X-Request-Id"] == r for x in bad.received)]
    assert retried and sorted(p.released) == sorted(retried)
    assert releases(router, "lease_expired", "accepted") == len(retried) and releases(router) == len(retried)


async def test_served_requests_release_nothing(fleet):
    """Negative control: a decode that took the params reads (or releases) them itself."""
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url, router = await start(fleet, [p], [d])
    for i in range(3):
        assert (await post(fleet, url, rid=f"r{i}"))[0] == 200
    await router.releases.settle()
    assert p.released == [] and releases(router) == 0
    assert all("kv_transfer_params" not in (x.body or {}) or "pdfleet_release" not in x.body["kv_transfer_params"]
               for x in p.received)


async def test_each_release_goes_to_the_prefill_that_holds_the_lease(fleet):
    p0 = await fleet.engine("p0", "prefill")
    p1 = await fleet.engine("p1", "prefill")
    d = await fleet.engine("d0", "decode", mode="http400")
    url, router = await start(fleet, [p0, p1], [d], prefill_policy="leastOutstanding")
    rids = [f"r{i}" for i in range(6)]
    for rid in rids:
        assert (await post(fleet, url, rid=rid))[0] == 400
    await router.releases.settle()
    for p in (p0, p1):  # the fake refuses a release that names another engine: none may be refused
        served = [x.headers["X-Request-Id"] for x in p.received if "pdfleet_release" not in x.body["kv_transfer_params"]]
        assert served and sorted(p.released) == sorted(served)
    assert releases(router, "decode_refused", "accepted") == len(rids) and releases(router) == len(rids)
