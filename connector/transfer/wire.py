"""Side-channel messages and their codec (msgspec/msgpack only, size-limited, optional HMAC).

A message travels as one ZMQ frame (the msgpack payload) or, when a secret is
configured, two frames: payload and ``HMAC-SHA256(secret, payload)``. ``Codec.decode``
raises ``BadMessage`` (with the reason) for anything it will not accept: the caller
drops it and counts it. Nothing here ever unpickles.

Completion notifications sent through NIXL use ``encode_notif``/``decode_notif``.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Union

import msgspec

from pdfleet.connector.transfer.layout import KVLayout, Region

__all__ = [
    "PROTOCOL_VERSION",
    "BadMessage",
    "Codec",
    "HandshakeRequest",
    "HandshakeReply",
    "HeartbeatRequest",
    "HeartbeatReply",
    "ErrorReply",
    "Request",
    "Reply",
    "Notif",
    "encode_notif",
    "decode_notif",
]

PROTOCOL_VERSION = 1
MAX_REQUEST_BYTES = 64 * 1024  # handshake/heartbeat requests are small
MAX_REPLY_BYTES = 16 * 1024 * 1024  # replies carry NIXL agent metadata
MAX_NOTIF_BYTES = 4096


class BadMessage(ValueError):
    """A message that is dropped: malformed, oversized, unsigned or wrongly signed."""


class HandshakeRequest(msgspec.Struct, tag="hs", frozen=True):
    id: int
    version: int
    engine_id: str
    compat_hash: str
    layout: KVLayout


class HandshakeReply(msgspec.Struct, tag="hs_ok", frozen=True):
    id: int
    engine_id: str
    instance_id: str
    agent_name: str
    agent_metadata: bytes
    regions: list[Region]
    layout: KVLayout
    compat_hash: str
    lease_seconds: float
    clock: float = 0.0  # the source's unix time when it answered (clock offset estimate)


class HeartbeatRequest(msgspec.Struct, tag="hb", frozen=True):
    """Extend the leases of these requests; the reply says how long each has left."""

    id: int
    request_ids: list[str]
    # The asking sink's NIXL agent name, so the reply can say which releases it caused.
    agent: str = ""


class HeartbeatReply(msgspec.Struct, tag="hb_ok", frozen=True):
    id: int
    instance_id: str
    # Seconds left on each lease after extension; requests the source does not hold
    # are absent from it.
    remaining: dict[str, float]
    # Requests whose lease ended (released or expired): their blocks may be reused.
    # Ids in neither field are unknown (possibly not held yet).
    gone: list[str] = []
    # Of `gone`: released because every reader's completion arrived, the asking agent's
    # among them. Its READ then ran while the blocks were held (the ack merely came late).
    released_by_you: list[str] = []


class ErrorReply(msgspec.Struct, tag="err", frozen=True):
    id: int
    reason: str


Request = Union[HandshakeRequest, HeartbeatRequest]
Reply = Union[HandshakeReply, HeartbeatReply, ErrorReply]


class Codec:
    """Encode/decode one direction of side-channel traffic with size limit and optional HMAC."""

    def __init__(self, kind: type, *, secret: bytes | None, max_bytes: int) -> None:
        if secret is not None and (not isinstance(secret, bytes) or not secret):
            raise ValueError("secret must be non-empty bytes or None")
        self._secret = secret
        self._max = max_bytes
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(kind)

    def _mac(self, payload: bytes) -> bytes:
        assert self._secret is not None
        return hmac.new(self._secret, payload, hashlib.sha256).digest()

    def encode(self, msg: msgspec.Struct) -> list[bytes]:
        payload = self._encoder.encode(msg)
        if len(payload) > self._max:
            raise ValueError(f"message of {len(payload)} bytes exceeds the limit of {self._max}")
        return [payload, self._mac(payload)] if self._secret is not None else [payload]

    def decode(self, frames: list[bytes]):
        if not frames:
            raise BadMessage("empty message")
        payload = frames[0]
        if len(payload) > self._max:
            raise BadMessage(f"oversized message: {len(payload)} bytes > limit {self._max}")
        if self._secret is not None:
            if len(frames) != 2:
                raise BadMessage("unsigned message (an HMAC frame is required)")
            if not hmac.compare_digest(self._mac(payload), frames[1]):
                raise BadMessage("wrong HMAC signature")
        elif len(frames) > 2:
            raise BadMessage(f"unexpected {len(frames)} frames")
        try:
            return self._decoder.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as exc:
            raise BadMessage(f"malformed message: {exc}") from None


def request_codec(secret: bytes | None) -> Codec:
    return Codec(Request, secret=secret, max_bytes=MAX_REQUEST_BYTES)


def reply_codec(secret: bytes | None) -> Codec:
    return Codec(Reply, secret=secret, max_bytes=MAX_REPLY_BYTES)


class Notif(msgspec.Struct, array_like=True, frozen=True):
    """Completion notification a reader attaches to its last READ (sent by NIXL)."""

    request_id: str
    readers: int  # reader ranks per source rank (k)
    reader_index: int
    parts: int  # READs this reader posted for the request (one per memory-type pair)
    part: int


_notif_encoder = msgspec.msgpack.Encoder()
_notif_decoder = msgspec.msgpack.Decoder(Notif)


def encode_notif(n: Notif) -> bytes:
    return _notif_encoder.encode(n)


def decode_notif(data: bytes) -> Notif:
    if len(data) > MAX_NOTIF_BYTES:
        raise BadMessage(f"oversized notification: {len(data)} bytes")
    try:
        n = _notif_decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as exc:
        raise BadMessage(f"malformed notification: {exc}") from None
    if not (0 < n.readers <= 1024 and 0 <= n.reader_index < n.readers and 0 < n.parts <= 16 and 0 <= n.part < n.parts):
        raise BadMessage(f"notification fields out of range: {n}")
    return n
