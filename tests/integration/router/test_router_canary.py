"""Canary split end to end (issue 22): a real router (real HTTP, EndpointSlice discovery through kmock's
API server) in front of fake engines of two revision pairs. The operator's only signal is the
pdfleet.io/canary-weight label on the canary's slices; the router follows it without a restart.
Measured from the engines' own request logs: the split over 1,000 conversations is within 3 points of
the weight, and no request has its prefill leg on one pair and its decode leg on the other (the check
is shown to catch a router that mixes them)."""

from __future__ import annotations

import asyncio

import pytest
from test_router_discovery import NS, apply, endpoint_slice, kubeconfig, patch, wait_health  # noqa: F401 (fixture)

from pdfleet.contract import labels

pytestmark = pytest.mark.timeout(120)
N = 1000


def legs_by_request(engines) -> dict[str, dict[str, set[str]]]:
    """X-Request-Id -> role -> the engines that got a leg of it (from the engines' logs)."""
    out: dict[str, dict[str, set[str]]] = {}
    for e in engines:
        for r in e.received:
            out.setdefault(r.headers["X-Request-Id"], {}).setdefault(e.role, set()).add(e.name)
    return out


def mixed_requests(engines, pair_of: dict[str, str]) -> list[str]:
    """Requests whose legs reached engines of more than one revision pair."""
    return [rid for rid, roles in legs_by_request(engines).items()
            if len({pair_of[name] for names in roles.values() for name in names}) > 1]


async def send(fleet, url: str, prompts: list[str], concurrency: int = 16) -> list[str]:
    """One completion per prompt; returns the revision each was answered from (the router's header)."""
    out: list[str] = [""] * len(prompts)
    queue = list(enumerate(prompts))

    async def worker() -> None:
        while queue:
            i, prompt = queue.pop()
            body = {"model": "tiny", "prompt": prompt, "max_tokens": 3}
            async with fleet.session.post(url + "/v1/completions", json=body,
                                          headers={"X-Request-Id": f"req-{i}-{len(prompt)}"}) as r:
                assert r.status == 200, await r.text()
                await r.read()
                out[i] = r.headers["x-pdfleet-revision"]

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return out


@pytest.fixture
def api(kmock):
    kmock.resources.load_bundled()
    return kmock


async def test_the_router_splits_by_the_canary_weight_and_keeps_both_legs_on_one_pair(api, kubeconfig, fleet):
    pa, da = await fleet.engine("pA", "prefill"), await fleet.engine("dA", "decode")
    pb, db = await fleet.engine("pB", "prefill"), await fleet.engine("dB", "decode")
    engines = (pa, da, pb, db)
    pair_of = {"pA": "r1", "dA": "r1", "pB": "r2", "dB": "r2"}
    await apply(fleet, api, endpoint_slice("p1", pa, "prefill", "r1", serving=True))
    await apply(fleet, api, endpoint_slice("d1", da, "decode", "r1", serving=True))
    canary = {labels.CANARY_WEIGHT: "30"}
    for name, eng, role in (("p2", pb, "prefill"), ("d2", db, "decode")):
        obj = endpoint_slice(name, eng, role, "r2", created="2026-02-01T00:00:00Z")
        obj["metadata"]["labels"].update(canary)
        await apply(fleet, api, obj)
    url = await fleet.router([], [], kubernetes_fleet="f1", kubernetes_namespace=NS, kubeconfig=kubeconfig)
    health = await wait_health(fleet, url, lambda h: (h.get("canary") or {}).get("weight") == 30, "canary at 30%")
    assert health["revision"] == "r1" and health["canary"]["revision"] == "r2"

    prompts = [f"conversation {i}: you are a helpful assistant. Question {i * 7919 % 1000}?" for i in range(N)]
    answered = await send(fleet, url, prompts)
    # measured at the engines: the canary pair's decode got its share of the requests
    share = len(db.received) / (len(da.received) + len(db.received)) * 100
    assert len(da.received) + len(db.received) == N
    print(f"measured canary share at weight 30: {share:.1f} % of {N}")
    assert abs(share - 30) <= 3, share
    assert answered.count("r2") == len(db.received)  # the client's view agrees with the engines'
    assert mixed_requests(engines, pair_of) == []
    assert all(roles.keys() == {"prefill", "decode"} for roles in legs_by_request(engines).values())

    # The operator raises the weight: only the label changes; the same router process follows.
    for name in ("p2", "d2"):
        await patch(fleet, api, name, {"metadata": {"labels": {labels.CANARY_WEIGHT: "70"}}})
    await wait_health(fleet, url, lambda h: (h.get("canary") or {}).get("weight") == 70, "canary at 70%")
    for e in engines:
        e.received.clear()
    again = await send(fleet, url, prompts)
    share = len(db.received) / N * 100
    print(f"measured canary share at weight 70: {share:.1f} % of {N}")
    assert abs(share - 70) <= 3, share
    # sticky and monotone: every conversation the canary had at 30 % it still has at 70 %
    assert all(b == "r2" for a, b in zip(answered, again) if a == "r2")
    assert mixed_requests(engines, pair_of) == []

    # Weight 0 (an abort): the serving pair takes everything again.
    for name in ("p2", "d2"):
        await patch(fleet, api, name, {"metadata": {"labels": {labels.CANARY_WEIGHT: "0"}}})
    await wait_health(fleet, url, lambda h: h.get("canary") is None, "no canary")
    assert set(await send(fleet, url, prompts[:50])) == {"r1"}


async def test_negative_control_the_mixing_check_catches_a_router_that_mixes_pairs(fleet):
    """A router given r1's prefill and r2's decode (a static, wrong configuration) mixes every request;
    the same check, on the same kind of engine logs, reports them all."""
    pa, db = await fleet.engine("pA", "prefill"), await fleet.engine("dB", "decode")
    url = await fleet.router([pa], [db])
    await send(fleet, url, [f"q{i}" for i in range(20)], concurrency=4)
    assert len(mixed_requests((pa, db), {"pA": "r1", "dB": "r2"})) == 20
