"""Hostile or mismatched side-channel traffic: dropped and counted, the server keeps serving."""

from __future__ import annotations

import pytest
import zmq
from transfer_harness import LAYOUT, wait_for

from pdfleet.connector.transfer import KVLayout, KVSource, Region, wire
from pdfleet.connector.transfer.sidechannel import secure_client_socket
from pdfleet.contract.connector_config import ConnectorExtraConfig

HOST = "127.0.0.1"
SECRET = b"fleet-secret"


def raw_exchange(port: int, frames: list[bytes], timeout_ms: int = 300,
                 secret: bytes | None = SECRET) -> list[bytes] | None:
    """Send frames from a raw DEALER of a peer holding ``secret`` (it passes the CURVE handshake;
    what it sends is up to the test); return the reply frames or None if nothing came back."""
    ctx = zmq.Context.instance()
    sock = secure_client_socket(ctx, secret)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"tcp://{HOST}:{port}")
        sock.send_multipart(frames)
        if sock.poll(timeout_ms, zmq.POLLIN):
            return sock.recv_multipart()
        return None
    finally:
        sock.close()


def good_request() -> wire.HandshakeRequest:
    return wire.HandshakeRequest(id=99, version=wire.PROTOCOL_VERSION, engine_id="probe", compat_hash="compat-1",
                                 layout=KVLayout(**LAYOUT))


def test_garbage_oversized_unsigned_and_badly_signed_are_dropped(source_factory):
    src = source_factory(secret=SECRET.hex())
    signed = wire.request_codec(SECRET).encode(good_request())
    bad = {
        "garbage": [b"\x93\xff\x00 definitely not msgpack"],
        "pickle": [b"\x80\x04\x95cos\nsystem\n."],
        "oversized": [b"\x00" * (wire.MAX_REQUEST_BYTES + 10), b"x" * 32],
        "unsigned": [signed[0]],
        "wrong-signature": [signed[0], wire.request_codec(b"not-the-secret").encode(good_request())[1]],
        "tampered": [signed[0][:-1] + b"\x01", signed[1]],
        "empty-frame": [b""],
    }
    for name, frames in bad.items():
        assert raw_exchange(src.port, frames) is None, name
    stats = src.stats()
    assert stats["messages_rejected"] == len(bad)
    assert stats["handshakes"] == 0
    # still serving: a correctly signed request gets a signed, decodable answer
    reply = raw_exchange(src.port, signed, timeout_ms=5000)
    assert reply is not None
    decoded = wire.reply_codec(SECRET).decode(reply)
    assert isinstance(decoded, wire.HandshakeReply) and decoded.id == 99
    assert decoded.instance_id == src.instance_id
    assert src.stats()["handshakes"] == 1


def test_sink_with_wrong_secret_or_hash_fails_cleanly_then_good_sink_pulls(source_factory, sink_factory, local_kv):
    src = source_factory(secret=SECRET.hex(), compat_hash="compat-1")
    cases = {
        "wrong-secret": dict(secret=b"guess", handshake_timeout=0.3, handshake_retries=2, heartbeat_timeout=0.3),
        "no-secret": dict(secret=None, handshake_timeout=0.3, handshake_retries=1, heartbeat_timeout=0.3),
        "wrong-hash": dict(secret=SECRET, compat_hash="compat-2"),
        "wrong-layout": dict(secret=SECRET, layout={"dtype": "float32"}),
    }
    reasons = {}
    for name, kw in cases.items():
        sink = sink_factory(local_kv, **kw)
        src.hold(name, [1])
        sink.pull(name, host=HOST, port=src.base_port, remote_engine_id="prefill-0",
                  remote_instance_id=src.instance_id, remote_block_ids=[1], local_block_ids=[1])
        ok, reasons[name] = wait_for(sink, name, timeout=10)
        assert not ok, name
        print(name, "->", reasons[name])
    assert "no reply" in reasons["wrong-secret"] and "secret mismatch" in reasons["wrong-secret"]
    assert "no reply" in reasons["no-secret"]
    assert "refused by the source: compat hash mismatch" in reasons["wrong-hash"]
    assert "layout mismatch: KVLayout.dtype differs" in reasons["wrong-layout"]
    assert not local_kv.block(0, 1).any()
    stats = src.stats()
    assert stats["handshakes_rejected"] == 2
    # The wrong key is refused at the CURVE handshake (once per connection); the keyless peer speaks
    # another ZMTP mechanism and never gets a message in at all.
    assert stats["messages_rejected"] >= 1 and stats["messages_bad_signature"] >= 1

    good = sink_factory(local_kv, secret=SECRET)
    src.hold("good", [1])
    good.pull("good", host=HOST, port=src.base_port, remote_engine_id="prefill-0",
              remote_instance_id=src.instance_id, remote_block_ids=[1], local_block_ids=[1])
    assert wait_for(good, "good") == (True, "")
    assert local_kv.block(0, 1).any()


def test_source_refuses_empty_or_wildcard_host():
    buf = bytearray(4096)
    import ctypes

    addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
    region = Region(base=addr, num_blocks=1, block_stride=4096, block_len=4096)
    for host, text in (("", "VLLM_NIXL_SIDE_CHANNEL_HOST"), ("0.0.0.0", "binds every interface")):
        with pytest.raises(ValueError, match=text):
            KVSource(engine_id="p", regions=[region], layout=KVLayout(**LAYOUT), host=host, port=0,
                     compat_hash="h", secret=None, settings=ConnectorExtraConfig(lease_seconds=1.0))


def test_oversized_heartbeat_is_refused_with_a_reason(source_factory):
    src = source_factory()
    req = wire.HeartbeatRequest(id=5, request_ids=[f"r{i}" for i in range(5000)])
    reply = raw_exchange(src.port, wire.request_codec(None).encode(req), timeout_ms=5000, secret=None)
    assert reply is not None
    decoded = wire.reply_codec(None).decode(reply)
    assert isinstance(decoded, wire.ErrorReply) and "too many request ids" in decoded.reason
    src.hold("x", [1])
    ok = raw_exchange(src.port, wire.request_codec(None).encode(wire.HeartbeatRequest(id=6, request_ids=["x", "y"])),
                      timeout_ms=5000, secret=None)
    decoded = wire.reply_codec(None).decode(ok)
    assert isinstance(decoded, wire.HeartbeatReply) and set(decoded.remaining) == {"x"}


def test_unsigned_and_replayed_handshakes_are_refused_and_counted(source_factory):
    """A captured, correctly signed handshake works once; sent again it is dropped as a replay."""
    src = source_factory(secret=SECRET.hex())
    signed = wire.request_codec(SECRET).encode(good_request())
    assert raw_exchange(src.port, signed, timeout_ms=5000) is not None  # the original is answered
    assert raw_exchange(src.port, signed) is None  # the replay is not
    assert raw_exchange(src.port, [signed[0]]) is None  # nor an unsigned copy
    stats = src.stats()
    assert (stats["handshakes"], stats["messages_replayed"], stats["messages_unsigned"]) == (1, 1, 1)
    # Negative control: a fresh signature over the same request is served.
    assert raw_exchange(src.port, wire.request_codec(SECRET).encode(good_request()), timeout_ms=5000) is not None
    assert src.stats()["handshakes"] == 2


def test_key_rotation_accepts_the_old_key_for_one_lease_then_refuses_it(source_factory, sink_factory, local_kv,
                                                                          tmp_path):
    """The source follows its key file (as a mounted Secret is updated): the new key works at once, the old
    one for the grace period (one lease), then only the new one."""
    import time

    old, new = b"old-key-" + b"o" * 24, b"new-key-" + b"n" * 24
    key_file = tmp_path / "key"
    key_file.write_bytes(old)
    src = source_factory(secret_file=str(key_file), lease=30.0, rotation_grace=2.0)

    def pull(name: str, secret: bytes) -> tuple[bool, str]:
        sink = sink_factory(local_kv, secret=secret, handshake_timeout=0.3, handshake_retries=2,
                            heartbeat_timeout=0.3)
        src.hold(name, [1])
        sink.pull(name, host=HOST, port=src.base_port, remote_engine_id="prefill-0",
                  remote_instance_id=src.instance_id, remote_block_ids=[1], local_block_ids=[1])
        return wait_for(sink, name, timeout=10)

    assert pull("before", old) == (True, "")
    key_file.write_bytes(new)
    rotated = time.monotonic()
    assert pull("new-key", new) == (True, "")  # an unknown key id makes the source re-read its file
    assert pull("old-key-in-grace", old) == (True, "")
    assert time.monotonic() - rotated < 2.0, "the grace test took too long to mean anything"
    time.sleep(max(0.0, 2.3 - (time.monotonic() - rotated)))
    ok, reason = pull("old-key-after-grace", old)
    assert not ok and "no reply" in reason
    assert src.stats()["messages_bad_signature"] >= 1
    assert pull("new-key-later", new) == (True, "")
