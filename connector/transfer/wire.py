"""Side-channel messages and their codec (msgspec/msgpack only, size-limited, signed).

A message travels as one ZMQ frame (the msgpack payload) or, when a key is
configured, two frames: payload and the auth frame of ``auth.py`` (key id, timestamp,
nonce, HMAC-SHA256). ``Codec.decode`` raises ``BadMessage`` (with the reason, and a
``kind`` for counting) for anything it will not accept, replays included: the caller
drops it and counts it. Nothing here ever unpickles.

Completion notifications sent through NIXL use ``encode_notif``/``decode_notif``.
"""

from __future__ import annotations

import time
from typing import Callable, Optional, Union

import msgspec

from pdfleet.connector.transfer import auth, bounds
from pdfleet.connector.transfer.layout import KVLayout, Region
from pdfleet.contract.kv_params import is_lease_id, lease_id_bytes

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
    "lease_id_list",
]

PROTOCOL_VERSION = 2  # 2: auth frame with key id, timestamp and nonce
MAX_REQUEST_BYTES = 64 * 1024  # handshake/heartbeat requests are small
MAX_REPLY_BYTES = 16 * 1024 * 1024  # replies carry NIXL agent metadata
MAX_NOTIF_BYTES = 4096
# A lease id (params 1.4: kv_params.lease_id_bytes random bytes); b"" in a message names none.
# No side-channel message nests deeper than a handful of levels (a reply: struct ->
# list of regions -> region -> field); anything deeper is refused before msgspec
# recurses into it.
MAX_DEPTH = 16


class BadMessage(ValueError):
    """A message that is dropped: malformed, oversized, unsigned, wrongly signed or replayed.

    ``kind`` names the reason for counters: malformed, oversized, too_deep, unsigned,
    bad_signature, unknown_key, stale, replayed.
    """

    def __init__(self, message: str, kind: str = "malformed") -> None:
        super().__init__(message)
        self.kind = kind



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
    """Extend the leases of these requests (or, with ``release``, end them); the reply says how long each has left."""

    id: int
    request_ids: list[str]
    # The asking sink's NIXL agent name, so the reply can say which releases it caused.
    agent: str = ""
    # True: the reader will not read these requests (aborted, or nothing to pull):
    # release their blocks now instead of at lease expiry.
    release: bool = False
    # How many readers (decode ranks) read each of these requests from this source rank:
    # the first agent to touch a lease binds it to at most this many (leases.py).
    readers: int = 1
    # params 1.4: the lease id of each request (same order; b"" for none); empty: none named
    # (a reader of older params). A lease held under an id acts only on messages naming it.
    lease_ids: list[bytes] = []


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
    # Never said of a lease with a lease id (a spent id confirms nothing, params 1.4).
    released_by_you: list[str] = []


class ErrorReply(msgspec.Struct, tag="err", frozen=True):
    id: int
    reason: str


Request = Union[HandshakeRequest, HeartbeatRequest]
Reply = Union[HandshakeReply, HeartbeatReply, ErrorReply]


Secret = Union[bytes, auth.KeyRing, None]


def key_ring(secret: Secret) -> Optional[auth.KeyRing]:
    if secret is None or isinstance(secret, auth.KeyRing):
        return secret
    if not isinstance(secret, bytes) or not secret:
        raise ValueError("secret must be non-empty bytes, a KeyRing, or None")
    return auth.KeyRing(secret)


class Codec:
    """Encode/decode one direction of side-channel traffic: size limit, signature, replay window.

    With a key, every decoded message must carry a valid auth frame whose timestamp is
    within ``replay_window`` seconds and whose nonce was not seen before.
    """

    def __init__(self, kind: type, *, secret: Secret, max_bytes: int,
                 replay_window: float = auth.DEFAULT_REPLAY_WINDOW,
                 clock: Callable[[], float] = time.time) -> None:
        self.ring = key_ring(secret)
        self._guard = (auth.ReplayGuard(replay_window, max_future=min(auth.DEFAULT_MAX_FUTURE, replay_window))
                       if self.ring is not None else None)
        self._clock = clock
        self._max = max_bytes
        self._encoder = msgspec.msgpack.Encoder()
        self._decoder = msgspec.msgpack.Decoder(kind)

    def encode(self, msg: msgspec.Struct, key_id: Optional[bytes] = None) -> list[bytes]:
        """Frames for ``msg``, signed with the key ``key_id`` names (if still accepted) or the current one."""
        payload = self._encoder.encode(msg)
        if len(payload) > self._max:
            raise ValueError(f"message of {len(payload)} bytes exceeds the limit of {self._max}")
        if self.ring is None:
            return [payload]
        now = self._clock()
        key = (self.ring.lookup(key_id, now) if key_id is not None else None) or self.ring.current
        return [payload, auth.sign(key, payload, now=now)]

    def decode(self, frames: list[bytes], now: Optional[float] = None):
        return self.decode_signed(frames, now)[0]

    def decode_signed(self, frames: list[bytes], now: Optional[float] = None) -> tuple[object, Optional[bytes]]:
        """(message, id of the key that signed it or None when unsigned). ``now``: the time the
        message's timestamp is judged against (default: the clock, read now)."""
        if not frames:
            raise BadMessage("empty message")
        payload = frames[0]
        if len(payload) > self._max:
            raise BadMessage(f"oversized message: {len(payload)} bytes > limit {self._max}", "oversized")
        kid = None
        if self.ring is not None:
            if len(frames) != 2:
                raise BadMessage("unsigned message (an auth frame is required)", "unsigned")
            try:
                kid = auth.verify(self.ring, payload, frames[1], self._guard,
                                  now=self._clock() if now is None else now)
            except auth.AuthError as exc:
                raise BadMessage(str(exc), exc.kind) from None
        elif len(frames) > 2:
            raise BadMessage(f"unexpected {len(frames)} frames")
        return _decode(self._decoder, payload, "message"), kid


def _decode(decoder: msgspec.msgpack.Decoder, payload: bytes, what: str):
    """Decode untrusted bytes: depth bounded first, every decoder failure a ``BadMessage``."""
    try:
        bounds.check_depth(payload, MAX_DEPTH)
    except bounds.TooDeep as exc:
        raise BadMessage(f"{what} {exc}", "too_deep") from None
    except bounds.Truncated as exc:
        raise BadMessage(f"malformed {what}: {exc}") from None
    try:
        return decoder.decode(payload)
    except RecursionError:  # belt and braces: the depth check above should make this unreachable
        raise BadMessage(f"{what} nested too deeply", "too_deep") from None
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError) as exc:
        raise BadMessage(f"malformed {what}: {exc}") from None


def request_codec(secret: Secret, **kw) -> Codec:
    return Codec(Request, secret=secret, max_bytes=MAX_REQUEST_BYTES, **kw)


def reply_codec(secret: Secret, **kw) -> Codec:
    return Codec(Reply, secret=secret, max_bytes=MAX_REPLY_BYTES, **kw)


class Notif(msgspec.Struct, array_like=True, frozen=True):
    """Completion notification a reader attaches to its last READ (sent by NIXL)."""

    request_id: str
    readers: int  # reader ranks per source rank (k)
    reader_index: int
    parts: int  # READs this reader posted for the request (one per memory-type pair)
    part: int
    lease_id: bytes = b""  # params 1.4: the lease's id (b"": none; a source before 1.4 ignores it)


_notif_encoder = msgspec.msgpack.Encoder()
_notif_decoder = msgspec.msgpack.Decoder(Notif)


def encode_notif(n: Notif) -> bytes:
    return _notif_encoder.encode(n)


def decode_notif(data: bytes) -> Notif:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise BadMessage(f"notification of type {type(data).__name__}, expected bytes")
    if len(data) > MAX_NOTIF_BYTES:
        raise BadMessage(f"oversized notification: {len(data)} bytes", "oversized")
    n = _decode(_notif_decoder, bytes(data), "notification")
    if not (0 < n.readers <= 1024 and 0 <= n.reader_index < n.readers and 0 < n.parts <= 16 and 0 <= n.part < n.parts):
        raise BadMessage(f"notification fields out of range: {n}", "out_of_range")
    if n.lease_id and not is_lease_id(n.lease_id):
        raise BadMessage(f"notification lease id of {len(n.lease_id)} bytes (expected {lease_id_bytes} or none)",
                         "out_of_range")
    return n


def lease_id_list(req: HeartbeatRequest) -> list[bytes | None] | None:
    """The lease id named with each of ``req``'s request ids (None: none), or None when it names none at
    all; raises ``BadMessage`` when the list does not fit the request ids."""
    if not req.lease_ids:
        return None
    if len(req.lease_ids) != len(req.request_ids):
        raise BadMessage(f"{len(req.lease_ids)} lease ids for {len(req.request_ids)} request ids", "out_of_range")
    if any(lid and not is_lease_id(lid) for lid in req.lease_ids):
        raise BadMessage(f"a lease id must be {lease_id_bytes} bytes (or empty for none)", "out_of_range")
    return [lid or None for lid in req.lease_ids]
