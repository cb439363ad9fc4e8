"""The router's half of decode -> next-turn prefill reuse (issue 40 part 3; serving/turn_reuse.py): which offer
a P/D turn's prefill gets, and the bounded table of offers per conversation (pure)."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving import turn_reuse as T
from pdfleet.contract import kv_params as K


def offer(blocks: int = 8, lease_seconds: float = 30.0, received_at: float = 100.0, url: str = "http://d0") -> T.Offer:
    p = K.produce(block_ids=list(range(blocks)), engine_id="d0", request_id="r", host="10.0.0.1", port=5600,
                  tp_size=1, instance_id=None, lease_seconds=lease_seconds, num_tokens=16 * blocks)
    return T.Offer(url, K.with_block_hashes(p, [bytes([i]) * 32 for i in range(blocks)]), received_at)


@pytest.mark.parametrize("o, now, min_tokens, want", [
    (offer(8), 101.0, 128, None),  # 128 tokens held, exactly the threshold
    (offer(8), 101.0, 129, T.UNUSED_TOO_FEW_TOKENS),  # negative control: one token short
    (offer(0), 101.0, 0, T.UNUSED_TOO_FEW_TOKENS),  # nothing held is never worth a pull
    (offer(8), 128.9, 0, None),  # 1.1 s of lease left, margin 1 s
    (offer(8), 129.0, 0, T.UNUSED_LEASE_SHORT),  # the lease would run out under the pull
    (offer(8, lease_seconds=0.5), 100.0, 0, T.UNUSED_LEASE_SHORT),
])
def test_usable(o, now, min_tokens, want):
    assert T.usable(o, now=now, min_tokens=min_tokens, block_size=16, margin_s=1.0) == want


def test_an_offer_serves_one_turn_and_a_newer_one_replaces_it():
    offers = T.Offers(limit=2)
    a, b = offer(url="http://a"), offer(url="http://b")
    assert offers.remember("k", a) == []
    assert offers.remember("k", b) == [(a, T.UNUSED_REPLACED)]  # released at the decode that held it
    assert offers.take("k") is b and offers.take("k") is None


def test_the_table_is_bounded_oldest_out_first():
    offers = T.Offers(limit=2)
    o1, o2, o3 = offer(url="1"), offer(url="2"), offer(url="3")
    offers.remember("a", o1)
    offers.remember("b", o2)
    assert offers.remember("c", o3) == [(o1, T.UNUSED_EVICTED)]
    assert len(offers) == 2 and offers.take("a") is None and offers.take("c") is o3


@pytest.mark.parametrize("params, is_offer", [
    (offer().params, True),
    ({K.DO_REMOTE_PREFILL: True}, False),  # a plain prefill's params: nothing to reuse
    ({K.ERROR_KEY: "x"}, False),
    (None, False),
    ([1], False),
])
def test_offer_of(params, is_offer):
    assert (T.offer_of(params) is not None) == is_offer


# -- keep-alives (keep_alive_plan; the table's kept/drop) ------------------------------------------------
def _plan(entries, now, busy=(), per_request=64):
    return T.keep_alive_plan(entries, now=now, busy=busy, per_request=per_request)


def test_an_offer_is_due_after_a_third_of_its_lease():
    o = offer(lease_seconds=30.0, received_at=100.0)
    early = _plan([("k", o)], 109.9)
    assert early.batches == {} and early.lapsed == [] and early.next_due == pytest.approx(110.0)
    assert _plan([("k", o)], 110.0).batches == {"http://d0": [[("k", o)]]}
    lapsed = _plan([("k", o)], 130.0)  # its lease ended: dropped, nothing sent
    assert lapsed.batches == {} and lapsed.lapsed == [("k", o)] and lapsed.next_due is None


@pytest.mark.parametrize("entries, busy, per_request, want", [
    # one request per decode, each at most per_request offers, oldest first
    ([("a", "http://d0"), ("b", "http://d1"), ("c", "http://d0")], (), 64,
     {"http://d0": [["a", "c"]], "http://d1": [["b"]]}),
    ([("a", "http://d0"), ("b", "http://d0"), ("c", "http://d0")], (), 2, {"http://d0": [["a", "b"], ["c"]]}),
    # a decode with a keep-alive in flight waits for it (negative control: the others still go)
    ([("a", "http://d0"), ("b", "http://d1")], ("http://d0",), 64, {"http://d1": [["b"]]}),
    ([], (), 64, {}),
])
def test_keep_alives_are_batched_per_decode(entries, busy, per_request, want):
    offers = {k: offer(url=u, received_at=100.0) for k, u in entries}
    plan = _plan(list(offers.items()), 111.0, busy, per_request)
    assert {u: [[k for k, _ in b] for b in bs] for u, bs in plan.batches.items()} == want


def test_offers_without_a_usable_lease_lapse():
    o = offer()
    bad = T.Offer("http://d0", dict(o.params, **{K.REMOTE_LEASE_SECONDS: -1}), 100.0)
    newer = T.Offer("http://d0", dict(o.params, **{K.VERSION_KEY: "9.0"}), 100.0)
    plan = _plan([("a", bad), ("b", newer)], 100.0)
    assert [k for k, _ in plan.lapsed] == ["a", "b"] and plan.batches == {}


def test_a_kept_offer_counts_its_lease_from_the_keep_alive_and_keeps_its_place():
    offers = T.Offers(limit=2)
    a, b = offer(url="a", received_at=100.0), offer(url="b", received_at=101.0)
    offers.remember("a", a)
    offers.remember("b", b)
    assert offers.kept("a", a, 125.0)
    kept = offers.items()[0][1]
    assert kept.received_at == 125.0 and T.usable(kept, now=140.0, min_tokens=0, block_size=16, margin_s=1.0) is None
    assert T.usable(a, now=140.0, min_tokens=0, block_size=16, margin_s=1.0) == T.UNUSED_LEASE_SHORT  # unkept
    assert not offers.kept("a", a, 126.0)  # the table holds another object now (the kept one)
    # eviction stays by age: the first offer is still the oldest
    assert offers.remember("c", offer(url="c")) == [(kept, T.UNUSED_EVICTED)]
    # an offer taken or replaced meanwhile is neither kept nor dropped
    assert offers.take("b") is b and not offers.kept("b", b, 130.0) and not offers.drop("b", b)
    c = offers.items()[-1][1]
    assert offers.drop("c", c) and len(offers) == 0


@pytest.mark.parametrize("status, data, count, want", [
    (200, b'{"kv_transfer_params": {"pdfleet_keep_alive": ["kept", "no such hold"]}}', 2, ["kept", "refused"]),
    (200, b'{"kv_transfer_params": {"pdfleet_keep_alive": ["kept"]}}', 2, ["unsupported"] * 2),
    (200, b'{"kv_transfer_params": null}', 1, ["unsupported"]),  # an engine without keep-alives
    (200, b"not json", 1, ["failed"]),
    (503, b"", 1, ["failed"]),
    (None, b"", 2, ["failed"] * 2),  # no answer
    (200, None, 1, ["failed"]),  # an answer past the bound (read_bounded gave up)
    (200, b'{"kv_transfer_params": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", 1, ["failed"]),  # nested past the bound
])
def test_keep_alive_outcomes(status, data, count, want):
    from pdfleet.connector.serving.keep_alive import keep_alive_outcomes

    assert keep_alive_outcomes(status, data, count) == want
