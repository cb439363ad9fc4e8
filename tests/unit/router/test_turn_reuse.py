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
