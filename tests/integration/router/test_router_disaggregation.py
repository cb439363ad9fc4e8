"""Conditional disaggregation end to end through a real router (issue 32): fake engines on loopback record
which legs they got. Short prompts and prompts that find every prefill busy go to decode alone (no prefill
leg, no kv_transfer_params), long ones keep both legs; ``Always`` (the negative control) keeps both legs for
all; the choice is counted, named in a response header, and never splits a canary pair."""

from __future__ import annotations

import asyncio

import pytest
from test_router_canary import api, legs_by_request, mixed_requests  # noqa: F401 (fixture)
from test_router_discovery import NS, apply, endpoint_slice, kubeconfig, wait_health  # noqa: F401 (fixture)
from test_router_proxy import metric_value

from pdfleet.contract import labels
from pdfleet.contract.metrics import ROUTER_DISAGGREGATION_DECISIONS
from pdfleet.contract.routing import DISAGGREGATION_HEADER, FALLBACK_HEADER

pytestmark = pytest.mark.timeout(120)
SHORT = "The river runs"
# The router has no tokenizer here: it estimates 4 characters a token (well above the 128-token minimum)
LONG = " ".join(f"block {i} of the prefill cache moves to decode over the network." for i in range(20))
COND = dict(disaggregation_policy="Conditional", min_remote_prefill_tokens=128, prefill_busy_in_flight=2,
            prefill_policy="leastOutstanding", decode_policy="leastOutstanding")


async def complete(fleet, url: str, prompt: str, rid: str, **extra) -> dict[str, str]:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 3, **extra}
    async with fleet.session.post(url + "/v1/completions", json=body, headers={"X-Request-Id": rid}) as r:
        assert r.status == 200, await r.text()
        await r.read()
        return dict(r.headers)


def decisions(text: str, decision: str, reason: str) -> float:
    return metric_value(text, f'{ROUTER_DISAGGREGATION_DECISIONS}_total{{decision="{decision}",reason="{reason}"}}')


async def metrics(fleet, url: str) -> str:
    async with fleet.session.get(url + "/metrics") as r:
        return await r.text()


@pytest.mark.parametrize("policy", ["Conditional", "Always"])
async def test_short_prompts_skip_the_prefill_leg_only_under_conditional(fleet, policy):
    p, d = await fleet.engine("p", "prefill"), await fleet.engine("d", "decode")
    settings = dict(COND, disaggregation_policy=policy)
    url = await fleet.router([p], [d], **settings)
    short = await complete(fleet, url, SHORT, "short-1")
    long = await complete(fleet, url, LONG, "long-1")
    legs = legs_by_request((p, d))
    decode_bodies = {r.headers["X-Request-Id"]: r.body for r in d.received}
    text = await metrics(fleet, url)
    assert legs["long-1"].keys() == {"prefill", "decode"} and "kv_transfer_params" in decode_bodies["long-1"]
    assert long[DISAGGREGATION_HEADER] == ("remote_prefill; reason=long_uncached" if policy == "Conditional"
                                           else "remote_prefill; reason=always")
    assert FALLBACK_HEADER not in short and FALLBACK_HEADER not in long  # a choice, not a failure of P/D
    if policy == "Conditional":
        assert legs["short-1"].keys() == {"decode"}  # prefill never saw it
        assert "kv_transfer_params" not in decode_bodies["short-1"]
        assert short[DISAGGREGATION_HEADER] == "decode_only; reason=short_prompt"
        assert decisions(text, "decode_only", "short_prompt") == 1
        assert decisions(text, "remote_prefill", "long_uncached") == 1
    else:  # negative control: the same prompts, both legs every time
        assert legs["short-1"].keys() == {"prefill", "decode"}
        assert decisions(text, "remote_prefill", "always") == 2


async def test_busy_prefills_send_long_prompts_to_an_idle_decode(fleet):
    p = await fleet.engine("p", "prefill", delay_s=1.0)  # a prefill with a queue
    d = await fleet.engine("d", "decode")
    url = await fleet.router([p], [d], **dict(COND, prefill_timeout_s=5.0))
    tasks = []
    for i in range(3):
        tasks.append(asyncio.ensure_future(complete(fleet, url, LONG + f" turn {i}", f"long-{i}")))
        while len(p.received) < min(i + 1, 2) and not tasks[-1].done():  # the prefill holds its first two legs
            await asyncio.sleep(0.01)
    answers = await asyncio.gather(*tasks)
    reasons = [a[DISAGGREGATION_HEADER] for a in answers]
    assert reasons == ["remote_prefill; reason=long_uncached"] * 2 + ["decode_only; reason=prefill_busy"], reasons
    assert legs_by_request((p, d))["long-2"].keys() == {"decode"}


async def test_n_above_one_is_counted_as_fan_out_under_either_policy(fleet):
    p, d = await fleet.engine("p", "prefill"), await fleet.engine("d", "decode")
    url = await fleet.router([p], [d], **COND)
    headers = await complete(fleet, url, LONG, "n2", n=2)
    assert headers[DISAGGREGATION_HEADER] == "decode_only; reason=fan_out" and headers[FALLBACK_HEADER]
    assert p.received == []
    assert decisions(await metrics(fleet, url), "decode_only", "fan_out") == 1


async def test_the_decision_never_splits_a_canary_pair(api, kubeconfig, fleet):
    pa, da = await fleet.engine("pA", "prefill"), await fleet.engine("dA", "decode")
    pb, db = await fleet.engine("pB", "prefill"), await fleet.engine("dB", "decode")
    engines = (pa, da, pb, db)
    pair_of = {"pA": "r1", "dA": "r1", "pB": "r2", "dB": "r2"}
    await apply(fleet, api, endpoint_slice("p1", pa, "prefill", "r1", serving=True))
    await apply(fleet, api, endpoint_slice("d1", da, "decode", "r1", serving=True))
    for name, eng, role in (("p2", pb, "prefill"), ("d2", db, "decode")):
        obj = endpoint_slice(name, eng, role, "r2", created="2026-02-01T00:00:00Z")
        obj["metadata"]["labels"][labels.CANARY_WEIGHT] = "50"
        await apply(fleet, api, obj)
    url = await fleet.router([], [], kubernetes_fleet="f1", kubernetes_namespace=NS, kubeconfig=kubeconfig, **COND)
    await wait_health(fleet, url, lambda h: (h.get("canary") or {}).get("weight") == 50, "canary at 50%")
    prompts = [(f"q{i}" if i % 2 else f"{LONG} conversation {i}") for i in range(200)]
    for i, prompt in enumerate(prompts):
        await complete(fleet, url, prompt, f"req-{i}")
    legs = legs_by_request(engines)
    assert mixed_requests(engines, pair_of) == []
    assert len(db.received) and len(da.received)  # both pairs served
    assert all(legs[f"req-{i}"].keys() == ({"decode"} if i % 2 else {"prefill", "decode"}) for i in range(200))
