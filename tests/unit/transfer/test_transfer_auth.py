"""Side-channel auth: signed envelopes, replay window, key rotation (pure, time passed in)."""

from __future__ import annotations

import pytest

from pdfleet.connector.transfer import auth, wire
from pdfleet.connector.transfer.layout import KVLayout

KEY = b"k" * 32
NEW = b"n" * 32
LAYOUT = KVLayout(block_size=16, dtype="bfloat16", layout="HND", num_kv_heads=2, head_dim=64, tp_rank=0, tp_size=1)


def hs(i: int = 1) -> wire.HandshakeRequest:
    return wire.HandshakeRequest(id=i, version=wire.PROTOCOL_VERSION, engine_id="d", compat_hash="h", layout=LAYOUT)


class Clock:
    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_replay_guard_table():
    g = auth.ReplayGuard(window=10)
    g.check(100.0, b"a" * 16, now=100.0)
    cases = [
        (100.0, b"a" * 16, 101.0, "replayed"),  # same nonce again within the window
        (80.0, b"b" * 16, 100.0, "stale"),  # too old
        (120.0, b"c" * 16, 100.0, "stale"),  # from the future beyond the window
        (110.5, b"g" * 16, 100.0, "stale"),  # ahead by more than max_future (10 s)
        (float("nan"), b"d" * 16, 100.0, "stale"),
    ]
    for ts, nonce, now, kind in cases:
        with pytest.raises(auth.AuthError) as exc:
            g.check(ts, nonce, now=now)
        assert exc.value.kind == kind, (ts, nonce, now)
    g.check(95.0, b"e" * 16, now=100.0)  # a fresh nonce inside the window passes
    # once the window has passed, old nonces are forgotten (and their timestamps are stale anyway)
    g.check(200.0, b"f" * 16, now=200.0)
    assert len(g) == 1


def test_replay_guard_bounded_memory_never_lets_a_forgotten_nonce_through():
    g = auth.ReplayGuard(window=100, capacity=3)
    for i in range(5):
        g.check(10.0 + i, bytes([i]) * 16, now=20.0)
    assert len(g) == 3
    with pytest.raises(auth.AuthError, match="older than"):
        g.check(10.0, bytes([0]) * 16, now=20.0)  # forgotten nonce: refused by the floor
    g.check(15.0, bytes([9]) * 16, now=20.0)


def test_codec_refuses_a_replayed_message_and_a_stale_one():
    clock = Clock()
    codec = wire.request_codec(KEY, clock=clock)
    frames = codec.encode(hs())
    assert codec.decode(frames) == hs()
    with pytest.raises(wire.BadMessage) as exc:
        codec.decode(frames)
    assert exc.value.kind == "replayed"
    late = codec.encode(hs(2))
    clock.t += auth.DEFAULT_REPLAY_WINDOW + 1
    with pytest.raises(wire.BadMessage) as exc:
        codec.decode(late)
    assert exc.value.kind == "stale"
    # Negative control: the same message encoded afresh is accepted.
    assert codec.decode(codec.encode(hs(2))) == hs(2)


def test_the_nonce_is_remembered_only_after_the_signature_verified():
    clock = Clock()
    codec = wire.request_codec(KEY, clock=clock)
    good = codec.encode(hs())
    forged = [good[0], good[1][:-1] + bytes([good[1][-1] ^ 0xFF])]  # same nonce, bad MAC
    with pytest.raises(wire.BadMessage) as exc:
        codec.decode(forged)
    assert exc.value.kind == "bad_signature"
    assert codec.decode(good) == hs()  # the forgery did not burn the nonce


@pytest.mark.parametrize("frames_of, kind", [
    (lambda f: [f[0]], "unsigned"),
    (lambda f: [f[0], wire.request_codec(NEW).encode(hs())[1]], "unknown_key"),
    (lambda f: [f[0] + b"\x00", f[1]], "bad_signature"),
    (lambda f: [b"\x00" * (wire.MAX_REQUEST_BYTES + 1), f[1]], "oversized"),
])
def test_codec_rejections_carry_a_kind_for_counting(frames_of, kind):
    codec = wire.request_codec(KEY)
    with pytest.raises(wire.BadMessage) as exc:
        codec.decode(frames_of(codec.encode(hs())))
    assert exc.value.kind == kind


def test_rotation_accepts_the_old_key_for_the_grace_period_only():
    clock = Clock()
    ring = auth.KeyRing(KEY, grace_seconds=30, clock=clock)
    old_id, new_id = auth.key_id(KEY), auth.key_id(NEW)
    assert ring.lookup(old_id) == KEY and ring.lookup(new_id) is None
    assert ring.rotate(NEW) and not ring.rotate(NEW)
    assert ring.current == NEW
    clock.t += 29.9
    assert ring.lookup(old_id) == KEY and ring.lookup(new_id) == NEW
    clock.t += 0.2
    assert ring.lookup(old_id) is None and ring.lookup(new_id) == NEW
    assert ring.accepted_ids() == [new_id]


def test_ring_follows_its_key_file_and_keeps_keys_when_the_file_is_unreadable():
    clock = Clock()
    content = {"key": KEY}

    def load() -> bytes:
        value = content["key"]
        if value is None:
            raise OSError("half-written")
        return value

    ring = auth.KeyRing(KEY, grace_seconds=10, loader=load, reload_seconds=5, clock=clock)
    content["key"] = NEW
    clock.t += 1
    assert ring.current == KEY  # not due yet
    assert ring.lookup(auth.key_id(NEW)) == NEW  # an unknown id forces an early re-read
    assert ring.current == NEW and ring.rotations == 1
    content["key"] = None
    clock.t += 6
    assert ring.current == NEW  # unreadable file: keys kept


def test_a_server_answers_with_the_key_the_request_used_during_rotation():
    """Prefill has rotated; a decode that still has the old key gets replies it can verify."""
    clock = Clock()
    prefill = auth.KeyRing(KEY, grace_seconds=30, clock=clock)
    prefill.rotate(NEW)
    prefill_req, prefill_rep = wire.request_codec(prefill, clock=clock), wire.reply_codec(prefill, clock=clock)
    decode_req, decode_rep = wire.request_codec(KEY, clock=clock), wire.reply_codec(KEY, clock=clock)
    msg, kid = prefill_req.decode_signed(decode_req.encode(hs()))
    assert kid == auth.key_id(KEY)
    reply = wire.ErrorReply(id=1, reason="x")
    assert decode_rep.decode(prefill_rep.encode(reply, kid)) == reply
    with pytest.raises(wire.BadMessage):  # negative control: signed with the current key, the old decode refuses
        decode_rep.decode(prefill_rep.encode(reply))
    clock.t += 31
    with pytest.raises(wire.BadMessage) as exc:  # after one lease period the old key is refused
        prefill_req.decode(decode_req.encode(hs(2)))
    assert exc.value.kind == "unknown_key"


@pytest.mark.parametrize("ts,now,past,future,want", [
    (100.0, 100.0, 30, 10, "ok"), (70.0, 100.0, 30, 10, "ok"), (69.9, 100.0, 30, 10, "stale"),
    (110.0, 100.0, 30, 10, "ok"), (110.1, 100.0, 30, 10, "stale"), (float("nan"), 100.0, 30, 10, "stale"),
    (float("inf"), 100.0, 30, 10, "stale"),
])  # fmt: skip
def test_replay_verdict(ts, now, past, future, want):
    assert auth.replay_verdict(ts, now, past, future) == want


def test_a_future_dated_nonce_never_becomes_the_floor():
    """Issue 19 row 9: a nonce dated ahead, then enough correctly timed messages to overflow the table:
    the floor stays at the oldest correctly timed timestamp, so honest peers are still served."""
    g = auth.ReplayGuard(window=30, capacity=100, max_future=10)
    g.check(109.0, b"F" * 16, now=100.0)
    for i in range(300):
        g.check(100.0 + i * 0.001, i.to_bytes(16, "big"), now=100.0 + i * 0.001)
    assert g.floor < 100.3
    g.check(100.31, b"honest-peer-msg!", now=100.31)  # another peer, correctly timed
    with pytest.raises(auth.AuthError):
        g.check(109.0, b"F" * 16, now=100.5)  # the future nonce is still remembered: no replay
