"""Decode's KV reused by the next turn's prefill (issue 40, part 3): the pure decisions (turn_reuse.py), the
contract's strict read of a reuse offer (``parse_reuse``) and its second signature (signed_params.py)."""

from __future__ import annotations

import pytest

from pdfleet.connector.adapter.signed_params import reuse_verifier, sign_params, sign_reuse, verifier
from pdfleet.connector.adapter.turn_reuse import hold_budget, holds_to_release, matched_blocks, tokens_to_pull
from pdfleet.connector.transfer.auth import KeyRing
from pdfleet.contract import kv_params as K

H = [bytes([i]) * 32 for i in range(8)]


@pytest.mark.parametrize("held, own, want", [
    (H[:4], H[:6], 4),  # the decode holds the history, the prompt goes on
    (H[:6], H[:4], 4),  # the prompt is shorter than what is held (an edited history)
    (H[:4], [H[0], H[1], H[5], H[3]], 2),  # diverges at block 2: the chain stops there
    ([H[5]] + H[1:4], H[:4], 0),  # negative control: first block differs, nothing matches
    ([], H[:4], 0),
    (H[:4], [], 0),
])
def test_matched_blocks(held, own, want):
    assert matched_blocks(held, own) == want


@pytest.mark.parametrize("matched, prompt, computed, min_tokens, want", [
    (6, 200, 64, 0, 6 * 16 - 64),  # pull past what prefill cached itself
    (6, 200, 0, 0, 96),
    (20, 100, 0, 0, 96),  # never past the prompt's full blocks
    (6, 200, 96, 0, 0),  # all cached locally: nothing
    (6, 200, 112, 0, 0),  # more cached locally than matched
    (6, 200, 64, 32, 32),  # exactly the threshold: pulled
    (6, 200, 64, 33, 0),  # negative control: one token under it, recomputed
    (0, 200, 0, 0, 0),
])
def test_tokens_to_pull(matched, prompt, computed, min_tokens, want):
    assert tokens_to_pull(matched, block_size=16, num_prompt_tokens=prompt, num_computed_tokens=computed,
                          min_tokens=min_tokens) == want


@pytest.mark.parametrize("holds, budget, want", [
    ([("a", 4), ("b", 4)], 8, ()),  # fits
    ([("a", 4), ("b", 4), ("c", 4)], 8, ("a",)),  # the oldest goes first
    ([("a", 2), ("b", 2), ("c", 10)], 8, ("a", "b", "c")),  # even the newest, when it alone is too big
    ([("a", 6), ("b", 1), ("c", 3)], 5, ("a",)),
    ([], 0, ()),
])
def test_holds_to_release(holds, budget, want):
    assert holds_to_release(holds, budget) == want


def test_hold_budget_is_a_share_of_the_cache():
    assert hold_budget(1000) == 500 and hold_budget(1000, 0.25) == 250 and hold_budget(0) == 0


# -- the offer on the wire ----------------------------------------------------------------------------
KEY = b"k" * 32


def _offer(key: bytes | None = KEY, hashes: list[bytes] | None = None) -> dict:
    p = K.produce(block_ids=[4, 5, 6], engine_id="decode-0", request_id="cmpl-9", host="10.0.0.8", port=5600,
                  tp_size=1, instance_id="i0", lease_seconds=30, num_tokens=48, hosts=())
    p = K.with_block_hashes(p, H[:3] if hashes is None else hashes)
    if key is not None:
        p[K.SIG_KEY] = sign_params(p, key)
        p[K.REUSE_SIG_KEY] = sign_reuse(p, key)
    return p


def _parse(params, key: bytes | None = KEY):
    ring = KeyRing(key) if key is not None else None
    return K.parse_reuse(params, local_tp_size=1, verify=verifier(ring), verify_reuse=reuse_verifier(ring),
                         accepted_at=100.0)


def test_a_signed_offer_reads_back():
    params = {K.DO_REMOTE_DECODE: True, **K.reuse_request(_offer(), 64)}
    reuse = _parse(params)
    assert reuse.block_hashes == tuple(H[:3]) and reuse.min_tokens == 64
    assert reuse.remote.remote_block_ids == (4, 5, 6) and reuse.remote.remote_host == "10.0.0.8"
    assert reuse.remote.lease_deadline == 130.0 and reuse.remote.remote_lease_id is not None
    assert K.reuse_offer(_offer()) and K.reuse_offer_tokens(_offer(), 16) == 48
    assert not K.reuse_offer({K.DO_REMOTE_PREFILL: True}) and K.reuse_offer_tokens(None, 16) == 0


def _tampered(change) -> dict:
    offer = _offer()
    change(offer)
    return {K.DO_REMOTE_DECODE: True, **K.reuse_request(offer, 0)}


@pytest.mark.parametrize("change, field", [
    (lambda o: o.__setitem__(K.REUSE_BLOCK_HASHES, [h.hex() for h in H[1:4]]), K.REUSE_SIG_KEY),  # other tokens
    (lambda o: o.__setitem__(K.REMOTE_HOST, "10.6.6.6"), K.SIG_KEY),  # another host
    (lambda o: o.pop(K.REUSE_SIG_KEY), K.REUSE_SIG_KEY),
    (lambda o: o.__setitem__(K.REUSE_BLOCK_HASHES, [H[0].hex()]), K.REUSE_BLOCK_HASHES),  # count != blocks
    (lambda o: o.__setitem__(K.REUSE_BLOCK_HASHES, ["zz", "00", "00"]), f"{K.REUSE_BLOCK_HASHES}[0]"),
    (lambda o: o.__setitem__(K.REUSE_BLOCK_HASHES, ["ab" * 65] * 3), f"{K.REUSE_BLOCK_HASHES}[0]"),
    (lambda o: o.__setitem__(K.REUSE_BLOCK_HASHES, "00"), K.REUSE_BLOCK_HASHES),
    (lambda o: o.__setitem__(K.REMOTE_BLOCK_IDS, [list(range(K.max_reuse_blocks + 1))]), K.REMOTE_BLOCK_IDS),
    (lambda o: o.pop(K.REMOTE_LEASE_ID), K.REMOTE_LEASE_ID),
    (lambda o: o.__setitem__(K.VERSION_KEY, "1.3"), K.VERSION_KEY),
    (lambda o: o.__setitem__(K.DO_REMOTE_PREFILL, False), K.DO_REMOTE_PREFILL),
])
def test_a_bad_offer_is_refused_naming_the_field(change, field):
    with pytest.raises(K.InvalidTransferParams) as err:
        _parse(_tampered(change))
    assert err.value.field == f"{K.REUSE_KEY}.{field}"


def test_offer_shapes():
    with pytest.raises(K.InvalidTransferParams) as err:
        _parse({K.DO_REMOTE_DECODE: True, K.REUSE_KEY: "x"})
    assert err.value.field == K.REUSE_KEY
    with pytest.raises(K.InvalidTransferParams) as err:
        _parse({K.DO_REMOTE_DECODE: True, **K.reuse_request(_offer(), 0), K.REUSE_MIN_TOKENS: -1})
    assert err.value.field == K.REUSE_MIN_TOKENS
    # without a fleet key no signature is checked (unsigned fleets: the same as remote prefill params)
    assert _parse({K.REUSE_KEY: _offer(key=None)}, key=None).min_tokens == 0
    # another key's signature is refused
    with pytest.raises(K.InvalidTransferParams):
        _parse({K.REUSE_KEY: _offer(key=b"o" * 32)})


def test_the_routers_ask_is_a_plain_flag():
    assert K.wants_hold_for_next_turn(K.hold_for_next_turn({K.DO_REMOTE_PREFILL: True}))
    assert not K.wants_hold_for_next_turn({K.HOLD_FOR_NEXT_TURN: "yes"})
    assert not K.wants_hold_for_next_turn(None)
    # the flag is not signed: adding it leaves prefill's signature valid
    p = _offer()
    verifier(KeyRing(KEY))(K.hold_for_next_turn(p))


# -- keep-alives: the request, the decode's strict read of each offer, the router's lenient read of the answer
def test_a_keep_alive_names_each_offers_signed_keys_and_is_bounded():
    o = _offer()
    params = K.keep_alive_request([o, o])
    sent = params[K.KEEP_ALIVE_KEY][0]
    assert K.REUSE_BLOCK_HASHES not in sent and K.REUSE_SIG_KEY not in sent  # only what the v3 signature covers
    verifier(KeyRing(KEY))(sent)
    assert K.wants_keep_alive(params) and not K.wants_keep_alive(o) and not K.wants_keep_alive(None)
    assert len(K.keep_alive_offers(params)) == 2
    with pytest.raises(ValueError):
        K.keep_alive_request([o] * (K.max_keep_alive_offers + 1))
    for bad in ([], [o] * (K.max_keep_alive_offers + 1), "x", {"a": 1}):
        with pytest.raises(K.InvalidTransferParams) as err:
            K.keep_alive_offers({K.KEEP_ALIVE_KEY: bad})
        assert err.value.field == K.KEEP_ALIVE_KEY


def _own(offer, key: bytes | None = KEY, engine: str = "decode-0"):
    return K.own_held_offer(offer, engine_id=engine, verify=verifier(KeyRing(key)) if key else None, index=3)


def test_a_decode_keeps_only_its_own_signed_holds():
    o = K.keep_alive_request([_offer()])[K.KEEP_ALIVE_KEY][0]
    assert _own(o) == ("cmpl-9", K.lease_id_of(o))
    assert _own(K.keep_alive_request([_offer(key=None)])[K.KEEP_ALIVE_KEY][0], key=None)[0] == "cmpl-9"


@pytest.mark.parametrize("change, engine, field", [
    (lambda o: None, "decode-1", K.REMOTE_ENGINE_ID),  # another decode's offer
    (lambda o: o.__setitem__(K.REMOTE_REQUEST_ID, "cmpl-8"), "decode-0", K.SIG_KEY),  # another hold, same engine
    (lambda o: o.__setitem__(K.REMOTE_LEASE_ID, "ab" * 16), "decode-0", K.SIG_KEY),  # a guessed lease id
    (lambda o: o.pop(K.SIG_KEY), "decode-0", K.SIG_KEY),
    (lambda o: o.pop(K.REMOTE_LEASE_ID), "decode-0", K.REMOTE_LEASE_ID),
    (lambda o: o.__setitem__(K.VERSION_KEY, "1.3"), "decode-0", K.VERSION_KEY),
    (lambda o: o.__setitem__(K.REMOTE_BLOCK_IDS, [list(range(K.max_reuse_blocks + 1))]), "decode-0",
     K.REMOTE_BLOCK_IDS),
])
def test_a_keep_alive_for_a_hold_not_its_own_is_refused_naming_the_field(change, engine, field):
    o = dict(K.keep_alive_request([_offer()])[K.KEEP_ALIVE_KEY][0])
    change(o)
    with pytest.raises(K.InvalidTransferParams) as err:
        _own(o, engine=engine)
    assert err.value.field == f"{K.KEEP_ALIVE_KEY}[3].{field}"
    with pytest.raises(K.InvalidTransferParams) as err:
        _own("x")
    assert err.value.field == f"{K.KEEP_ALIVE_KEY}[3]"


@pytest.mark.parametrize("params, count, want", [
    (K.keep_alive_reply([K.KEPT, "kv_transfer_params.x: no"]), 2, [True, False]),
    (K.keep_alive_reply([K.KEPT]), 2, None),  # not one verdict per offer
    (K.keep_alive_reply([True]), 1, None),
    (K.error_params("no"), 1, None),  # the whole request refused: no verdicts
    (None, 1, None),  # an engine without keep-alives
])
def test_the_routers_read_of_a_keep_alive_answer(params, count, want):
    assert K.keep_alive_answer(params, count) == want
