"""A ZMTP 3.0 client (RFC 23, NULL mechanism) that bounds whole messages, for the router's KV-event sockets.

Why not a libzmq socket: libzmq bounds a *frame* (``ZMQ_MAXMSGSIZE``) and counts its high-water mark in
*complete* messages; the parts of a multipart message that never ends are buffered inside libzmq
without limit (issue 31: one publisher grew the router by 162 MiB under a 16 MiB budget). Here the
router reads frames itself: a message whose frames add up past ``max_bytes``, or that has more than
``max_frames`` frames, is refused before its next frame is read, and the connection is dropped. The
only message held is the one being read; the kernel's socket buffer and the publisher's own queue
absorb bursts (a publisher then drops, and the subscriber's sequence numbers see the gap).

The peers are real libzmq sockets (vLLM's PUB and replay ROUTER): this speaks their wire protocol as a
SUB or a DEALER, over ``tcp://host:port`` or ``ipc:///path``. Pure framing (``greeting``, ``ready``,
``frame_header``, ``parse_header``) is table-tested; ``Connection`` is the asyncio edge.
"""

from __future__ import annotations

import asyncio
import struct

SUB, DEALER = "SUB", "DEALER"
_PEERS = {SUB: ("PUB", "XPUB"), DEALER: ("ROUTER", "DEALER")}
MORE, LONG, COMMAND = 0x01, 0x02, 0x04
_MAX_COMMAND_BYTES = 4096  # READY and friends; a peer's bigger command is a protocol error
CONNECT_TIMEOUT_S = 2.0
# asyncio's read buffer: it pauses the socket past twice this, so a frame bigger than that is read in
# pause/resume rounds; 1 MiB keeps those few and bounds what is read ahead of a frame to 2 MiB.
READ_LIMIT = 2**20


class ProtocolError(Exception):
    """The peer does not speak ZMTP 3 as expected (the connection is dropped)."""


class MessageTooLarge(ProtocolError):
    """A message's frames add up past the bound, or it has too many frames (the connection is dropped)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # "oversized" or "frames": the subscriber's drop reasons


def greeting() -> bytes:
    """Our 64-byte greeting: signature, version 3.0, mechanism NULL, as-server 0, filler."""
    return b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31


def check_greeting(data: bytes) -> None:
    if len(data) != 64 or data[0] != 0xFF or data[9] != 0x7F:
        raise ProtocolError("not a ZMTP peer (bad signature)")
    if data[10] < 3:
        raise ProtocolError(f"ZMTP {data[10]}.x peer: version 3 or later needed")
    if data[12:32].rstrip(b"\x00") != b"NULL":
        raise ProtocolError(f"security mechanism {data[12:32].rstrip(bytes(1))!r}: only NULL is spoken here")


def frame_header(size: int, *, more: bool = False, command: bool = False) -> bytes:
    flags = (MORE if more else 0) | (COMMAND if command else 0)
    if size > 255:
        return bytes([flags | LONG]) + struct.pack(">Q", size)
    return bytes([flags, size])


def parse_header(flags: int) -> tuple[bool, bool, int]:
    """(more, command, bytes of the size field) of a frame's flags byte."""
    if flags & ~(MORE | LONG | COMMAND):
        raise ProtocolError(f"reserved frame flags set: {flags:#x}")
    if flags & COMMAND and flags & MORE:
        raise ProtocolError("a command frame with MORE set")
    return bool(flags & MORE), bool(flags & COMMAND), 8 if flags & LONG else 1


def ready(socket_type: str) -> bytes:
    """The READY command frame (header and body) announcing ``socket_type``."""
    props = b""
    for name, value in ((b"Socket-Type", socket_type.encode()), (b"Identity", b"")):
        props += bytes([len(name)]) + name + struct.pack(">I", len(value)) + value
    body = bytes([5]) + b"READY" + props
    return frame_header(len(body), command=True) + body


def parse_ready(body: bytes) -> dict[str, bytes]:
    """The properties of a READY command body; ProtocolError when it is another command or malformed."""
    if not body or body[1:1 + body[0]] != b"READY":
        raise ProtocolError(f"expected READY, got command {body[1:1 + (body[0] if body else 0)]!r}")
    props, i = {}, 1 + body[0]
    while i < len(body):
        n = body[i]
        name = body[i + 1:i + 1 + n]
        if i + 1 + n + 4 > len(body):
            raise ProtocolError("truncated READY property")
        (size,) = struct.unpack(">I", body[i + 1 + n:i + 5 + n])
        value = body[i + 5 + n:i + 5 + n + size]
        if len(value) != size:
            raise ProtocolError("truncated READY property")
        props[name.decode("latin-1").lower()] = value
        i += 5 + n + size
    return props


def parse_endpoint(endpoint: str) -> tuple[str, str | int]:
    """("tcp", (host, port)) or ("ipc", path) of a ZMQ endpoint the router connects to."""
    if endpoint.startswith("ipc://"):
        return "ipc", endpoint[len("ipc://"):]
    if endpoint.startswith("tcp://"):
        host, sep, port = endpoint[len("tcp://"):].rpartition(":")
        if not sep or not port.isdigit() or not host:
            raise ValueError(f"{endpoint!r}: expected tcp://host:port")
        return "tcp", f"{host.strip('[]')}:{port}"
    raise ValueError(f"{endpoint!r}: only tcp:// and ipc:// endpoints are supported")


class Connection:
    """One ZMTP connection as a SUB (subscribed to everything) or a DEALER."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, endpoint: str, socket_type: str, *, timeout_s: float = CONNECT_TIMEOUT_S) -> "Connection":
        kind, where = parse_endpoint(endpoint)
        async with asyncio.timeout(timeout_s):
            if kind == "ipc":
                reader, writer = await asyncio.open_unix_connection(str(where), limit=READ_LIMIT)
            else:
                host, _, port = str(where).rpartition(":")
                reader, writer = await asyncio.open_connection(host, int(port), limit=READ_LIMIT)
            conn = cls(reader, writer)
            try:
                await conn._handshake(socket_type)
            except BaseException:
                conn.close()
                raise
        return conn

    async def _handshake(self, socket_type: str) -> None:
        self.writer.write(greeting())
        check_greeting(await self.reader.readexactly(64))
        self.writer.write(ready(socket_type))
        flags = (await self.reader.readexactly(1))[0]
        _more, command, size_len = parse_header(flags)
        size = int.from_bytes(await self.reader.readexactly(size_len), "big")
        if not command or size > _MAX_COMMAND_BYTES:
            raise ProtocolError("expected the peer's READY command")
        peer = parse_ready(await self.reader.readexactly(size)).get("socket-type", b"").decode("latin-1")
        if peer not in _PEERS[socket_type]:
            raise ProtocolError(f"a {socket_type} cannot talk to a {peer or 'nameless'} socket")
        if socket_type == SUB:  # ZMTP 3.0 subscription: a message of 0x01 + topic (empty: everything)
            self.writer.write(frame_header(1) + b"\x01")
        await self.writer.drain()

    async def send_multipart(self, frames: list[bytes]) -> None:
        for i, f in enumerate(frames):
            self.writer.write(frame_header(len(f), more=i < len(frames) - 1) + f)
        await self.writer.drain()

    async def recv_multipart(self, *, max_bytes: int, max_frames: int) -> list[bytes]:
        """The next message; MessageTooLarge before a frame that would take it past either bound is read.
        Not cancellation-safe mid-message: a caller that gives up drops the connection."""
        frames: list[bytes] = []
        total = 0
        while True:
            flags = (await self.reader.readexactly(1))[0]
            more, command, size_len = parse_header(flags)
            size = int.from_bytes(await self.reader.readexactly(size_len), "big")
            if command:
                if frames or size > _MAX_COMMAND_BYTES:
                    raise ProtocolError("a command inside a message, or an oversized command")
                await self.reader.readexactly(size)  # e.g. PING from a 3.1 peer: nothing to do
                continue
            if total + size > max_bytes:
                raise MessageTooLarge("oversized", f"a message of more than {max_bytes} bytes")
            if len(frames) == max_frames:
                raise MessageTooLarge("frames", f"a message of more than {max_frames} frames")
            frames.append(await self.reader.readexactly(size))
            total += size
            if not more:
                return frames

    def close(self) -> None:
        self.writer.close()
