"""The router's ZMTP 3.0 framing (connector/serving/kvaware/zmtp.py), and its client against real libzmq peers."""

from __future__ import annotations

import asyncio

import pytest
import zmq

from pdfleet.connector.serving.kvaware import zmtp


@pytest.mark.parametrize("size,more,command,expected", [
    (0, False, False, b"\x00\x00"),
    (255, True, False, b"\x01\xff"),
    (256, False, False, b"\x02" + (256).to_bytes(8, "big")),
    (5, False, True, b"\x04\x05"),
])
def test_frame_header(size, more, command, expected) -> None:
    assert zmtp.frame_header(size, more=more, command=command) == expected


@pytest.mark.parametrize("flags,expected", [
    (0x00, (False, False, 1)), (0x01, (True, False, 1)), (0x03, (True, False, 8)), (0x06, (False, True, 8)),
])
def test_parse_header(flags, expected) -> None:
    assert zmtp.parse_header(flags) == expected


@pytest.mark.parametrize("flags", [0x08, 0x80, 0x05])
def test_parse_header_refuses_reserved_bits_and_commands_with_more(flags) -> None:
    with pytest.raises(zmtp.ProtocolError):
        zmtp.parse_header(flags)


def test_greeting_and_ready_round_trip() -> None:
    g = zmtp.greeting()
    assert len(g) == 64
    zmtp.check_greeting(g)
    with pytest.raises(zmtp.ProtocolError, match="signature"):
        zmtp.check_greeting(b"GET / HTTP/1.1\r\n".ljust(64, b" "))
    with pytest.raises(zmtp.ProtocolError, match="CURVE"):
        zmtp.check_greeting(g[:12] + b"CURVE".ljust(20, b"\x00") + g[32:])
    frame = zmtp.ready("SUB")
    assert frame[0] == zmtp.COMMAND and frame[1] == len(frame) - 2
    assert zmtp.parse_ready(frame[2:]) == {"socket-type": b"SUB", "identity": b""}
    with pytest.raises(zmtp.ProtocolError, match="READY"):
        zmtp.parse_ready(b"\x04PING")
    with pytest.raises(zmtp.ProtocolError, match="truncated"):
        zmtp.parse_ready(frame[2:-2])


@pytest.mark.parametrize("endpoint,expected", [
    ("tcp://127.0.0.1:5557", ("tcp", "127.0.0.1:5557")),
    ("tcp://[::1]:5557", ("tcp", "::1:5557")),
    ("ipc:///run/prefill.kv", ("ipc", "/run/prefill.kv")),
])
def test_parse_endpoint(endpoint, expected) -> None:
    assert zmtp.parse_endpoint(endpoint) == expected


@pytest.mark.parametrize("endpoint", ["tcp://host", "inproc://x", "tcp://:1", "tcp://h:port"])
def test_parse_endpoint_refuses(endpoint) -> None:
    with pytest.raises(ValueError):
        zmtp.parse_endpoint(endpoint)


async def test_a_sub_and_a_dealer_against_real_libzmq_peers_and_the_message_bounds() -> None:
    ctx = zmq.Context()
    pub, router = ctx.socket(zmq.PUB), ctx.socket(zmq.ROUTER)
    pub_port, router_port = pub.bind_to_random_port("tcp://127.0.0.1"), router.bind_to_random_port("tcp://127.0.0.1")
    sub = await zmtp.Connection.open(f"tcp://127.0.0.1:{pub_port}", zmtp.SUB)
    dealer = await zmtp.Connection.open(f"tcp://127.0.0.1:{router_port}", zmtp.DEALER)
    try:
        await asyncio.sleep(0.3)  # the subscription reaches the publisher
        pub.send_multipart([b"", b"12345678", b"x" * 300])
        assert await asyncio.wait_for(sub.recv_multipart(max_bytes=400, max_frames=3), 5) == \
            [b"", b"12345678", b"x" * 300]
        pub.send_multipart([b"", b"12345678", b"x" * 500])  # 508 bytes: over the bound of 400
        with pytest.raises(zmtp.MessageTooLarge) as exc:
            await asyncio.wait_for(sub.recv_multipart(max_bytes=400, max_frames=3), 5)
        assert exc.value.reason == "oversized"
        await dealer.send_multipart([b"", b"\x00" * 8])
        got = await asyncio.to_thread(router.recv_multipart)
        assert got[1:] == [b"", b"\x00" * 8]
        router.send_multipart([got[0], b"", b"a", b"b", b"c"])
        with pytest.raises(zmtp.MessageTooLarge) as exc:
            await asyncio.wait_for(dealer.recv_multipart(max_bytes=100, max_frames=3), 5)
        assert exc.value.reason == "frames"
    finally:
        sub.close()
        dealer.close()
        pub.close(0)
        router.close(0)
        ctx.term()


async def test_a_sub_refuses_a_peer_of_the_wrong_type() -> None:
    ctx = zmq.Context()
    push = ctx.socket(zmq.PUSH)
    port = push.bind_to_random_port("tcp://127.0.0.1")
    try:
        with pytest.raises((zmtp.ProtocolError, asyncio.IncompleteReadError, ConnectionError)):
            await zmtp.Connection.open(f"tcp://127.0.0.1:{port}", zmtp.SUB)
    finally:
        push.close(0)
        ctx.term()
