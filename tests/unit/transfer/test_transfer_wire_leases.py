"""Codec (msgpack, size limit, HMAC), notifications, lease table, bind-host checks, lease verdicts."""

from __future__ import annotations

import hashlib
import hmac

import msgspec
import pytest

from pdfleet.connector.transfer import auth, wire
from pdfleet.connector.transfer.layout import KVLayout, Region
from pdfleet.connector.transfer.leases import LeaseTable
from pdfleet.connector.transfer.sidechannel import check_bind_host, zmq_address
from pdfleet.connector.transfer.pull_state import lease_verdict

LAYOUT = KVLayout(block_size=16, dtype="bfloat16", layout="HND", num_kv_heads=2, head_dim=64, tp_rank=0, tp_size=1)


def handshake(**kw) -> wire.HandshakeRequest:
    fields = dict(id=7, version=wire.PROTOCOL_VERSION, engine_id="d", compat_hash="h", layout=LAYOUT)
    fields.update(kw)
    return wire.HandshakeRequest(**fields)


def test_roundtrip_unsigned_and_signed():
    for secret in (None, b"s3cret"):
        codec = wire.request_codec(secret)
        frames = codec.encode(handshake())
        assert len(frames) == (2 if secret else 1)
        assert codec.decode(frames) == handshake()


def test_reply_carries_regions_and_layout():
    codec = wire.reply_codec(None)
    reply = wire.HandshakeReply(
        id=1, engine_id="p", instance_id="i", agent_name="a", agent_metadata=b"\x00\x01",
        regions=[Region(base=4096, num_blocks=2, block_stride=64, block_len=64)], layout=LAYOUT,
        compat_hash="h", lease_seconds=3.0,
    )
    assert codec.decode(codec.encode(reply)) == reply


def test_auth_frame_is_hmac_sha256_over_header_and_payload():
    frames = wire.request_codec(b"k").encode(handshake())
    head, mac = frames[1][:-32], frames[1][-32:]
    assert len(frames[1]) == auth.AUTH_FRAME_BYTES and head[:8] == auth.key_id(b"k")
    assert mac == hmac.new(b"k", auth.DOMAIN + head + frames[0], hashlib.sha256).digest()


@pytest.mark.parametrize(
    "frames_of, message",
    [
        (lambda f: [f[0]], "unsigned message"),
        (lambda f: [f[0], b"x" * 32], "auth frame of 32 bytes"),
        (lambda f: [f[0], wire.request_codec(b"other").encode(handshake())[1]], "key this side does not accept"),
        (lambda f: [f[0] + b"\x00", f[1]], "wrong HMAC signature"),
        (lambda f: [f[0], f[1][:-1] + bytes([f[1][-1] ^ 1])], "wrong HMAC signature"),
        (lambda f: [], "empty message"),
    ],
)
def test_signed_codec_drops_bad_signatures(frames_of, message):
    codec = wire.request_codec(b"k")
    with pytest.raises(wire.BadMessage, match=message):
        codec.decode(frames_of(codec.encode(handshake())))


@pytest.mark.parametrize(
    "payload, message",
    [
        (b"\xff\x00garbage", "malformed message"),
        (msgspec.msgpack.encode({"type": "nope", "id": 1}), "malformed message"),
        (msgspec.msgpack.encode({"type": "hs", "id": "x"}), "malformed message"),
        # a layout whose validation fails on decode (tp_rank out of range)
        (msgspec.msgpack.encode({"type": "hs", "id": 1, "version": 1, "engine_id": "d", "compat_hash": "h",
                                 "layout": {**msgspec.to_builtins(LAYOUT), "tp_rank": 5}}), "malformed message"),
        (b"\x00" * (wire.MAX_REQUEST_BYTES + 1), "oversized message"),
    ],
)
def test_codec_drops_garbage(payload, message):
    with pytest.raises(wire.BadMessage, match=message):
        wire.request_codec(None).decode([payload])


def test_pickle_payload_is_rejected():
    import pickle

    with pytest.raises(wire.BadMessage):
        wire.request_codec(None).decode([pickle.dumps(handshake().__class__)])


def test_encode_refuses_oversized():
    with pytest.raises(ValueError, match="exceeds the limit"):
        wire.request_codec(None).encode(wire.HeartbeatRequest(id=1, request_ids=["x" * 100] * 1000))


def test_notif_roundtrip_and_rejects():
    n = wire.Notif("req-1", readers=2, reader_index=1, parts=1, part=0)
    assert wire.decode_notif(wire.encode_notif(n)) == n
    for bad in (b"junk", wire.encode_notif(wire.Notif("r", 2, 2, 1, 0)), wire.encode_notif(wire.Notif("r", 1, 0, 1, 1)),
                b"\x00" * 5000):
        with pytest.raises(wire.BadMessage):
            wire.decode_notif(bad)


def test_lease_expires_without_heartbeat():
    t = LeaseTable(10.0)
    assert t.hold("a", [1, 2], now=100.0) == 110.0
    assert t.collect(now=109.9) == []
    assert t.collect(now=110.0) == ["a"]
    assert t.expired == 1 and t.completed == 0
    assert t.collect(now=200.0) == []


def test_heartbeat_extends_but_never_revives():
    t = LeaseTable(10.0)
    t.hold("a", [1], now=0.0)
    assert t.extend(["a", "unknown"], now=8.0) == ({"a": 10.0}, [], [])
    assert t.collect(now=15.0) == []  # would have expired at 10 without the heartbeat
    assert t.extend(["a"], now=18.5) == ({}, ["a"], [])  # expired (not yet collected) stays expired
    assert t.collect(now=18.5) == ["a"]
    assert t.extend(["a", "later"], now=19.0) == ({}, ["a"], [])  # gone, not unknown
    t.hold("later", [2], now=19.0)
    assert t.extend(["later"], now=19.5) == ({"later": 10.0}, [], [])


def test_completion_before_hold_is_kept():
    t = LeaseTable(10.0)
    assert not t.complete("early", readers=1, reader_index=0, parts=1, part=0)
    t.hold("early", [1], now=0.0)
    assert t.collect(now=0.1) == ["early"]
    assert t.completed == 1 and t.expired == 0
    # partial early completion: the hold still waits for the rest
    t.complete("half", readers=2, reader_index=0, parts=1, part=0)
    t.hold("half", [1], now=0.0)
    assert t.collect(now=0.1) == []
    assert t.complete("half", readers=2, reader_index=1, parts=1, part=0)


def test_completion_waits_for_every_reader_and_part():
    t = LeaseTable(10.0)
    t.hold("a", [1], now=0.0)
    assert not t.complete("a", readers=2, reader_index=0, parts=1, part=0)
    assert not t.complete("a", readers=2, reader_index=0, parts=1, part=0)  # duplicate does not count twice
    assert t.collect(now=1.0) == []
    assert t.complete("a", readers=2, reader_index=1, parts=1, part=0)
    assert t.collect(now=1.0) == ["a"]
    assert t.completed == 1 and t.expired == 0
    assert not t.complete("a", readers=1, reader_index=0, parts=1, part=0)  # already released


def test_lease_seconds_must_be_positive():
    with pytest.raises(ValueError, match="lease_seconds must be > 0"):
        LeaseTable(0)


@pytest.mark.parametrize("host", ["", "   ", None])
def test_bind_host_refuses_empty(host):
    with pytest.raises(ValueError, match="VLLM_NIXL_SIDE_CHANNEL_HOST"):
        check_bind_host(host)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "*"])
def test_bind_host_refuses_wildcard_unless_asked(host):
    with pytest.raises(ValueError, match="binds every interface"):
        check_bind_host(host)
    assert check_bind_host(host, allow_wildcard=True) == host


def test_zmq_address_brackets_ipv6():
    assert zmq_address("10.0.0.5", 5600) == "tcp://10.0.0.5:5600"
    assert zmq_address("fd00::5", 5600) == "tcp://[fd00::5]:5600"


def test_lease_verdict():
    assert lease_verdict(5.0, None) == "unknown"
    assert lease_verdict(5.0, 6.0) == "ok"
    assert lease_verdict(6.0, 6.0) == "expired"
    assert lease_verdict(7.0, 6.0) == "expired"


def test_release_is_credited_only_to_the_agents_that_completed_it():
    t = LeaseTable(10.0)
    t.hold("read", [1], now=0.0)
    assert t.complete("read", readers=1, reader_index=0, parts=1, part=0, agent="sink-a")
    t.hold("lapsed", [2], now=0.0)
    assert t.collect(now=11.0) == ["read", "lapsed"]
    # sink-a's own completion released "read"; "lapsed" expired, which credits nobody
    assert t.extend(["read", "lapsed"], now=12.0, agent="sink-a") == ({}, ["read", "lapsed"], ["read"])
    # negative control: another agent asking about the same release gets no credit
    assert t.extend(["read"], now=12.0, agent="sink-b") == ({}, ["read"], [])
    # a completion that overtook the hold still credits its agent once the hold arrives
    assert not t.complete("early", readers=1, reader_index=0, parts=1, part=0, agent="sink-c")
    t.hold("early", [3], now=13.0)
    assert t.extend(["early"], now=13.5, agent="sink-c") == ({}, ["early"], ["early"])


def test_release_ends_a_lease_now_but_one_before_the_hold_cannot_poison_it():
    t = LeaseTable(30.0)
    t.hold("held", [1, 2], now=0.0)
    assert t.release(["held", "unknown-yet"]) == ["held"]
    assert t.collect(now=0.1) == ["held"] and t.released == 1
    left, gone, _ = t.extend(["held"], now=0.2)
    assert left == {} and gone == ["held"]
    # A notice that overtook the hold is not remembered (issue 19 row 7): the lease is held normally.
    t.hold("unknown-yet", [3], now=0.3)
    assert t.collect(now=0.3) == [] and t.early_releases_ignored == 1 and len(t) == 1
    # Negative control: a lease nobody released stays held until it expires.
    t.hold("kept", [4], now=1.0)
    assert t.collect(now=30.9) == ["unknown-yet"] and t.collect(now=31.1) == ["kept"] and t.expired == 2


@pytest.mark.parametrize("claimants,cap,agent,readers,want", [
    (set(), 0, "a", 1, (True, 1)),
    (set(), 0, "a", 2, (True, 2)),
    (set(), 0, "a", 0, (True, 1)),
    (set(), 0, "a", 10**9, (True, 1024)),
    ({"a"}, 1, "a", 5, (True, 1)),
    ({"a"}, 1, "b", 1, (False, 1)),
    ({"a"}, 2, "b", 1, (True, 2)),
    ({"a", "b"}, 2, "c", 2, (False, 2)),
])  # fmt: skip
def test_may_act(claimants, cap, agent, readers, want):
    from pdfleet.connector.transfer.leases import may_act

    assert may_act(claimants, cap, agent, readers) == want


def test_only_the_agents_a_lease_is_bound_to_extend_release_or_complete_it():
    t = LeaseTable(10.0)
    t.hold("r", [1], now=0.0)
    assert t.extend(["r"], now=1.0, agent="sink-a")[0] == {"r": 10.0}  # first touch: bound to sink-a
    assert t.extend(["r"], now=2.0, agent="thief")[0] == {}  # learns nothing, extends nothing
    assert t.release(["r"], agent="thief") == []
    assert not t.complete("r", readers=1, reader_index=0, parts=1, part=0, agent="thief")
    assert len(t) == 1 and t.refused == 3
    assert t.complete("r", readers=1, reader_index=0, parts=1, part=0, agent="sink-a")  # negative control
    # two readers (decode TP 2 x prefill TP 1): both join, a third does not
    t.hold("tp2", [2], now=3.0)
    assert "tp2" in t.extend(["tp2"], now=3.0, agent="rank0", readers=2)[0]
    assert "tp2" in t.extend(["tp2"], now=3.0, agent="rank1", readers=2)[0]
    assert "tp2" not in t.extend(["tp2"], now=3.0, agent="rank2", readers=2)[0]


@pytest.mark.parametrize("touch, released", [
    (None, True),  # no reader touched it: nobody will read it, freed now
    (lambda t: t.extend(["a"], now=1.0, agent="decode-agent"), False),  # claimed by a heartbeat
    (lambda t: t.complete("a", readers=2, reader_index=0, parts=1, part=0, agent="decode-agent"), False),  # half read
])
def test_release_unclaimed_frees_only_a_lease_no_reader_claimed(touch, released):
    t = LeaseTable(10.0)
    t.hold("a", [1, 2], now=0.0)
    if touch is not None:
        touch(t)
    assert t.release_unclaimed(["a", "never-held"]) == (["a"] if released else [])
    assert t.collect(now=2.0) == (["a"] if released else [])
    assert (t.released_unread, t.unread_refused) == ((1, 0) if released else (0, 1))
    if released:  # gone, and a late heartbeat hears so (the reader's pull fails and recomputes)
        assert t.extend(["a"], now=3.0, agent="decode-agent") == ({}, ["a"], [])
    else:  # the reader goes on holding it
        assert t.extend(["a"], now=3.0, agent="decode-agent")[0] == {"a": 10.0}


# -- single-use leases (params 1.4, issue 30) ---------------------------------------------------------
L1, L2, FORGED = b"\x01" * 16, b"\x02" * 16, b"\x0f" * 16


@pytest.mark.parametrize("held, given, want", [
    (None, None, True),  # a lease from before 1.4, a reader of 1.3 params
    (L1, L1, True),
    (L1, None, False),  # names the request, not the lease: a 1.3 reader, a thief, a forged notification
    (L1, FORGED, False),
    (L1, L2, False),
    (None, L1, False),  # an id for a lease held without one proves nothing either
])  # fmt: skip
def test_proves(held, given, want):
    from pdfleet.connector.transfer.leases import proves

    assert proves(held, given) is want


def test_a_lease_with_an_id_acts_only_on_messages_naming_it():
    t = LeaseTable(10.0)
    t.hold("r", [1], now=0.0, lease_id=L1)
    # a key holder who knows the request id but not the lease id: learns nothing, ends nothing
    assert t.extend(["r"], now=0.5, agent="thief", lease_ids=[None]) == ({}, [], [])
    assert t.extend(["r"], now=0.5, agent="thief", lease_ids=[FORGED]) == ({}, [], [])
    assert t.release(["r"], agent="thief") == [] and t.release(["r"], agent="thief", lease_ids=[FORGED]) == []
    assert not t.complete("r", readers=1, reader_index=0, parts=1, part=0, agent="thief")  # forged notification
    assert t.release_unclaimed(["r"], [FORGED]) == []
    assert t.proof_refused == 6 and t.refused == 0 and len(t) == 1
    # none of that claimed it: the reader who has the params does (negative control: the same calls with the id)
    assert t.extend(["r"], now=1.0, agent="sink-a", lease_ids=[L1])[0] == {"r": 10.0}
    assert t.complete("r", readers=1, reader_index=0, parts=1, part=0, agent="sink-a", lease_id=L1)
    assert t.collect(now=1.1) == ["r"]


def test_a_spent_lease_id_never_confirms_or_starts_another_pull():
    t = LeaseTable(10.0)
    t.hold("r", [5], now=0.0, lease_id=L1)
    assert t.extend(["r"], now=0.1, agent="sink-a", lease_ids=[L1])[0] == {"r": 10.0}
    assert t.complete("r", readers=1, reader_index=0, parts=1, part=0, agent="sink-a", lease_id=L1)
    assert t.collect(now=0.2) == ["r"]
    # the same agent replays the params: gone, and never "released by you" (its own earlier pull's word)
    assert t.extend(["r"], now=1.0, agent="sink-a", lease_ids=[L1]) == ({}, ["r"], [])
    assert not t.complete("r", readers=1, reader_index=0, parts=1, part=0, agent="sink-a", lease_id=L1)
    assert t.spent_refused == 2
    # the request id held again (blocks reused) under a new id: the old id still gets nothing
    t.hold("r", [5], now=2.0, lease_id=L2)
    assert t.extend(["r"], now=2.1, agent="sink-a", lease_ids=[L1]) == ({}, ["r"], [])
    assert not t.complete("r", readers=1, reader_index=0, parts=1, part=0, agent="sink-a", lease_id=L1)
    assert t.release(["r"], agent="sink-a", lease_ids=[L1]) == [] and len(t) == 1
    # negative control: a lease without an id (1.3) credits the same agent's late ask
    t.hold("old", [6], now=3.0)
    assert t.complete("old", readers=1, reader_index=0, parts=1, part=0, agent="sink-a")
    assert t.extend(["old"], now=3.1, agent="sink-a") == ({}, ["old"], ["old"])


def test_expired_and_released_ids_are_spent_too():
    t = LeaseTable(1.0)
    t.hold("x", [1], now=0.0, lease_id=L1)
    t.hold("y", [2], now=0.0, lease_id=L2)
    assert t.release(["y"], agent="sink-a", lease_ids=[L2]) == ["y"]
    assert sorted(t.collect(now=1.5)) == ["x", "y"]
    assert t.extend(["x", "y"], now=1.6, agent="sink-a", lease_ids=[L1, L2]) == ({}, ["x", "y"], [])
    assert t.spent_refused == 2 and t.proof_refused == 0


def test_early_completions_without_the_id_do_not_complete_a_1_4_hold():
    t = LeaseTable(10.0)
    assert not t.complete("r", readers=1, reader_index=0, parts=1, part=0, agent="forger")  # before the hold
    assert not t.complete("q", readers=1, reader_index=0, parts=1, part=0, agent="forger", lease_id=L2)
    assert t.proof_refused == 1  # a 1.4 reader posts nothing before its grant: an early one with an id is forged
    t.hold("r", [1], now=0.0, lease_id=L1)
    assert t.collect(now=0.1) == [] and len(t) == 1  # still held
    # negative control: without a lease id (1.3) the early completion releases the hold, as before
    t.complete("s", readers=1, reader_index=0, parts=1, part=0, agent="sink-a")
    t.hold("s", [2], now=0.2)
    assert t.collect(now=0.3) == ["s"]


def test_spent_ids_are_bounded_in_count_and_age():
    from pdfleet.connector.transfer.leases import SpentIds

    spent = SpentIds(limit=3, ttl=10.0)
    for i in range(5):
        spent.add(bytes([i]) * 16, now=float(i))
    assert len(spent) == 3 and bytes([1]) * 16 not in spent and bytes([4]) * 16 in spent
    spent.prune(now=12.5)  # ids 2 (spent at 2.0) is older than 10 s
    assert bytes([2]) * 16 not in spent and bytes([3]) * 16 in spent
    with pytest.raises(ValueError):
        SpentIds(limit=0, ttl=1.0)
    # a forgotten spent id still matches no live lease: the request is then unknown, never granted
    t = LeaseTable(1.0)
    t._spent = SpentIds(limit=1, ttl=100.0)
    t.hold("a", [1], now=0.0, lease_id=L1)
    t.hold("b", [2], now=0.0, lease_id=L2)
    t.collect(now=2.0)  # both expired; only one id fits the memory
    assert len(t._spent) == 1
    left, gone, mine = t.extend(["a", "b"], now=3.0, agent="sink-a", lease_ids=[L1, L2])
    assert left == {} and mine == [] and sorted(gone) == ["a", "b"]  # the request ids are remembered apart


@pytest.mark.parametrize("lease_ids, problem", [
    ([b"\x01" * 16], None),
    ([b""], None),
    ([], None),
    ([b"\x01" * 15], "16 bytes"),
    ([b"\x01" * 16, b"\x02" * 16], "2 lease ids for 1 request ids"),
])  # fmt: skip
def test_heartbeat_lease_ids_are_checked(lease_ids, problem):
    req = wire.HeartbeatRequest(id=1, request_ids=["r"], lease_ids=lease_ids)
    if problem is None:
        got = wire.lease_id_list(req)
        assert got == (None if not lease_ids else [lease_ids[0] or None])
        return
    with pytest.raises(wire.BadMessage, match=problem):
        wire.lease_id_list(req)


def test_a_notification_carries_the_lease_id_and_an_old_source_ignores_it():
    import msgspec

    n = wire.Notif("r", 1, 0, 1, 0, b"\x01" * 16)
    assert wire.decode_notif(wire.encode_notif(n)) == n
    assert wire.decode_notif(wire.encode_notif(wire.Notif("r", 1, 0, 1, 0))).lease_id == b""
    with pytest.raises(wire.BadMessage, match="lease id of 3 bytes"):
        wire.decode_notif(wire.encode_notif(wire.Notif("r", 1, 0, 1, 0, b"abc")))

    class OldNotif(msgspec.Struct, array_like=True, frozen=True):  # a source before 1.4
        request_id: str
        readers: int
        reader_index: int
        parts: int
        part: int

    assert msgspec.msgpack.decode(wire.encode_notif(n), type=OldNotif).request_id == "r"


def test_the_holder_keeps_a_lease_alive_without_claiming_it():
    """Issue 40: a decode keeps its hold for the next turn alive (the router's keep-alive); the lease stays the
    next reader's to claim, and is never revived nor extended without its id."""
    lid, other = b"a" * 16, b"b" * 16
    t = LeaseTable(10.0)
    t.hold("r1", [1, 2], now=0.0, lease_id=lid)
    assert t.keep(["r1"], [lid], now=8.0) == ["r1"]
    assert t.collect(12.0) == []  # past the first lease: kept
    assert t.keep(["r1"], [other], now=9.0) == [] and t.keep(["r1"], [None], now=9.0) == []  # no id, no keep
    assert t.proof_refused == 2
    # unclaimed: a reader still claims it, and a second agent is still refused
    left, _, _ = t.extend(["r1"], now=12.0, agent="reader", lease_ids=[lid])
    assert left == {"r1": 10.0}
    t.extend(["r1"], now=12.0, agent="intruder", lease_ids=[lid])
    assert t.refused == 1
    assert t.collect(22.0) == ["r1"]  # negative control: nobody kept it alive after 12 s
    assert t.keep(["r1"], [lid], now=22.5) == []  # expired: never revived
    t.hold("r2", [3], now=30.0, lease_id=other)
    assert t.keep(["r2"], [other], now=40.0) == []  # at its end: not revived
