"""decodeReuse in the router (issue 40 part 3; serving/turn_reuse.py): real router, fake engines over real HTTP.
A P/D turn's decode leg asks the decode to hold; its offer goes to the conversation's next P/D prefill leg;
an offer no prefill will read (the next turn decode-alone, too few tokens, replaced) is released at the decode
that holds it; streamed turns and turns without a conversation key are not asked to hold; off (the default),
nothing of it happens (negative control). Between turns each kept offer is kept alive at its decode, so a turn
later than the decode's lease still gets it; an offer whose keep-alive the decode refuses is dropped."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from pdfleet.connector.router.app import ROUTER_KEY
from pdfleet.connector.serving import turn_reuse
from pdfleet.contract import kv_params as K
from pdfleet.contract import metrics as names

pytestmark = pytest.mark.timeout(30)
SESSION = {"x-session-id": "conv-1"}


def body(turn: int, **kw) -> dict:
    return {"model": "tiny", "prompt": "hello " * (turn + 1), "max_tokens": 4, **kw}


async def post(fleet, url, b, headers=SESSION, rid="r"):
    async with fleet.session.post(url + "/v1/completions", json=b, headers={"X-Request-Id": rid, **headers}) as r:
        return r.status, await r.json(content_type=None) if r.status == 200 and not b.get("stream") else await r.read()


async def start(fleet, min_tokens: int, **engine):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", **engine)
    url = await fleet.router([p], [d], decode_reuse_min_tokens=min_tokens)
    return p, d, url, fleet.runners[-1].app[ROUTER_KEY]


def prefill_legs(p) -> list[dict]:
    return [x.body["kv_transfer_params"] for x in p.received if not K.wants_release(x.body["kv_transfer_params"])]


def reuse_releases(router) -> float:
    return sum(s.value for m in router.metrics.registry.collect() for s in m.samples
               if s.name == names.ROUTER_KV_RELEASES + "_total" and s.labels["reason"] == "reuse_unused"
               and s.labels["outcome"] == "accepted")


async def test_the_next_turn_prefill_gets_the_last_turns_offer(fleet):
    p, d, url, router = await start(fleet, 64)
    status, answer = await post(fleet, url, body(1), rid="t1")
    assert status == 200 and K.wants_hold_for_next_turn(d.received[-1].body["kv_transfer_params"])
    # the offer (its lease id, the fleet's signatures) stays with the router: the client's answer has none
    assert len(router.offers) == 1 and "kv_transfer_params" not in answer and answer["choices"]
    assert prefill_legs(p)[-1] == K.remote_decode_request()  # the first turn has nothing to pull
    await post(fleet, url, body(2), rid="t2")
    leg = prefill_legs(p)[-1]
    assert leg[K.DO_REMOTE_DECODE] is True and leg[K.REUSE_MIN_TOKENS] == 64
    assert leg[K.REUSE_KEY][K.REMOTE_REQUEST_ID] == "t1" and leg[K.REUSE_KEY][K.REMOTE_ENGINE_ID] == "d0"
    # single use: another conversation gets nothing, and the same offer is never handed out twice
    await post(fleet, url, body(3), headers={"x-session-id": "conv-2"}, rid="o1")
    assert K.REUSE_KEY not in prefill_legs(p)[-1]
    await router.releases.settle()
    assert d.released == [] and reuse_releases(router) == 0


async def test_too_few_tokens_recompute_and_release_the_hold(fleet):
    p, d, url, router = await start(fleet, 8 * 16 + 1, reuse_blocks=8)  # the offer holds 128 tokens
    await post(fleet, url, body(1), rid="t1")
    await post(fleet, url, body(2), rid="t2")
    assert K.REUSE_KEY not in prefill_legs(p)[-1]
    await router.releases.settle()
    assert d.released == ["t1"] and reuse_releases(router) == 1


async def test_streamed_turns_are_not_asked_to_hold_but_may_pull(fleet):
    p, d, url, router = await start(fleet, 0)
    await post(fleet, url, body(1), rid="t1")
    await post(fleet, url, body(2, stream=True), rid="t2")  # vLLM returns no params on a stream: no hold asked
    assert not K.wants_hold_for_next_turn(d.received[-1].body["kv_transfer_params"])
    assert prefill_legs(p)[-1][K.REUSE_KEY][K.REMOTE_REQUEST_ID] == "t1"  # it still pulls the last turn's
    assert len(router.offers) == 0


@pytest.mark.parametrize("extra, headers, held", [
    ({}, {}, False),  # a text prompt's first turn is no name: one-shot requests would pin decode memory
    ({"user": "u-7"}, {}, True),
    ({"prompt_cache_key": "c-7"}, {}, True),
    ({}, SESSION, True),
])
async def test_only_a_conversation_the_client_names_is_asked_to_hold(fleet, extra, headers, held):
    p, d, url, router = await start(fleet, 0)
    status, _ = await post(fleet, url, body(1, **extra), headers=headers, rid="t1")
    assert status == 200 and K.wants_hold_for_next_turn(d.received[-1].body["kv_transfer_params"]) is held
    assert len(router.offers) == int(held)


async def test_an_offer_the_next_turn_cannot_use_is_released_at_its_decode(fleet):
    """The next turn goes decode alone (Conditional, short prompts): the hold is released, not left to lapse;
    a newer offer for the same conversation releases the older."""
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d], decode_reuse_min_tokens=0, disaggregation_policy="Conditional",
                             min_remote_prefill_tokens=1_000_000)
    router = fleet.runners[-1].app[ROUTER_KEY]

    def offer(rid: str) -> turn_reuse.Offer:
        params = K.with_block_hashes(K.produce(block_ids=[1, 2], engine_id="d0", request_id=rid, host="127.0.0.1",
                                               port=5600, tp_size=1, instance_id=None, lease_seconds=30,
                                               num_tokens=32), [b"a" * 32, b"b" * 32])
        return turn_reuse.Offer(d.url, params, time.monotonic())

    router.offers.remember("session:conv-1", offer("old"))
    router.pipeline.remember_offer(_Served(), "session:conv-1", d.url, json.dumps(
        {"kv_transfer_params": offer("newer").params}).encode())
    await post(fleet, url, body(2), rid="t2")  # decode alone
    assert p.received == []
    await router.releases.settle()
    assert sorted(d.released) == ["newer", "old"] and reuse_releases(router) == 2


class _Served:
    class request:
        body = {"model": "tiny"}
        upstream_headers = {"X-Request-Id": "bg"}


async def test_without_a_conversation_key_nothing_is_held(fleet):
    p, d, url, router = await start(fleet, 0)
    await post(fleet, url, {"model": "tiny", "prompt": [5, 6, 7], "max_tokens": 2}, headers={}, rid="ids")
    assert not K.wants_hold_for_next_turn(d.received[-1].body["kv_transfer_params"])
    assert len(router.offers) == 0


async def test_off_by_default(fleet):
    """Negative control: the same turns with decodeReuse off: no hold asked, no offer passed on."""
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    router = fleet.runners[-1].app[ROUTER_KEY]
    for turn in (1, 2, 3):
        await post(fleet, url, body(turn), rid=f"t{turn}")
        assert not K.wants_hold_for_next_turn(d.received[-1].body["kv_transfer_params"])
        assert prefill_legs(p)[-1] == K.remote_decode_request()
    assert router.offers is None


LEASE = 1.5  # the fake decode's lease in the keep-alive tests (seconds)


def keep_alives(router, outcome: str) -> float:
    return sum(s.value for m in router.metrics.registry.collect() for s in m.samples
               if s.name == names.ROUTER_KV_KEEP_ALIVES + "_total" and s.labels["outcome"] == outcome)


async def test_an_offer_kept_alive_outlives_the_decodes_lease(fleet):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", lease_s=LEASE)
    url = await fleet.router([p], [d], decode_reuse_min_tokens=0, lease_margin_s=0.2)
    router = fleet.runners[-1].app[ROUTER_KEY]
    await post(fleet, url, body(1), rid="t1")
    await asyncio.sleep(2 * LEASE)  # two leases: without keep-alives the offer would be gone
    assert d.kept.count("t1") >= 3 and keep_alives(router, K.KEPT) == d.kept.count("t1")
    ka = [x.body for x in d.received if K.wants_keep_alive(x.body["kv_transfer_params"])]
    assert ka[0]["model"] == "tiny" and ka[0]["max_tokens"] == 1  # one-token requests, the client's model
    await post(fleet, url, body(2), rid="t2")
    assert prefill_legs(p)[-1][K.REUSE_KEY][K.REMOTE_REQUEST_ID] == "t1"
    assert len(router.offers) == 1  # turn 2's own offer, kept alive in turn


async def test_an_offer_whose_keep_alive_is_refused_is_dropped(fleet):
    """Negative control: the decode no longer has the hold (it needed the memory): the router drops the offer,
    and the next turn computes its history (nothing to release)."""
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", lease_s=LEASE, keeps=False)
    url = await fleet.router([p], [d], decode_reuse_min_tokens=0, lease_margin_s=0.2)
    router = fleet.runners[-1].app[ROUTER_KEY]
    await post(fleet, url, body(1), rid="t1")
    await asyncio.sleep(LEASE / 3 + 0.5)
    assert len(router.offers) == 0 and keep_alives(router, "refused") == 1 and d.kept == []
    await post(fleet, url, body(2), rid="t2")
    assert K.REUSE_KEY not in prefill_legs(p)[-1]
    await router.releases.settle()
    assert d.released == []
