"""Side-channel authentication: keys that rotate, signed envelopes, replay refusal (pure).

A signed message is two ZMQ frames: the msgpack payload and a fixed 64-byte auth frame

    key_id (8) | timestamp (8, big-endian float64 unix seconds) | nonce (16) | HMAC-SHA256 (32)

where the HMAC covers a domain tag, key_id, timestamp, nonce and payload. The receiver
looks the key up by id (so a ring can hold the new and the old key during a rotation),
checks the HMAC, then the timestamp against a window and the nonce against those seen
within it: a message replayed later, or twice, is refused. Nonces are remembered only
after the HMAC verified, so an attacker without the key cannot fill the table.

``KeyRing`` holds the current key (used to sign) and, after a rotation, the previous
ones with the time until which they are still accepted (one lease period: a decode
that still signs with the old key can finish reading what it holds). A ring may be
given a loader (the mounted Secret file): it re-reads it at most every
``reload_seconds`` and rotates when the bytes changed; an unknown key id forces an
early re-read (rate-limited), because the peer may have seen the new Secret first.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import os
import struct
import threading
import time
from typing import Callable, Optional

__all__ = [
    "AUTH_FRAME_BYTES",
    "AuthError",
    "KeyRing",
    "ReplayGuard",
    "key_id",
    "sign",
    "verify",
]

DOMAIN = b"pdfleet-side-channel-v2\x00"
KEY_ID_BYTES = 8
NONCE_BYTES = 16
MAC_BYTES = 32
AUTH_FRAME_BYTES = KEY_ID_BYTES + 8 + NONCE_BYTES + MAC_BYTES
DEFAULT_REPLAY_WINDOW = 30.0  # seconds a message may be older than the receiver's clock
DEFAULT_MAX_FUTURE = 10.0  # seconds a message may be dated ahead of it (clock skew between pods)
MAX_REMEMBERED_NONCES = 262_144
MIN_FORCED_RELOAD_SECONDS = 1.0


class AuthError(ValueError):
    """A message refused by authentication. ``kind``: unsigned, bad_signature, unknown_key, stale, replayed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def key_id(key: bytes) -> bytes:
    """Public, stable id of a key (never reveals it)."""
    return hashlib.sha256(b"pdfleet-key-id\x00" + key).digest()[:KEY_ID_BYTES]


def _mac(key: bytes, head: bytes, payload: bytes) -> bytes:
    return hmac.new(key, DOMAIN + head + payload, hashlib.sha256).digest()


def sign(key: bytes, payload: bytes, *, now: float, nonce: Optional[bytes] = None) -> bytes:
    """The auth frame for ``payload`` signed with ``key`` at time ``now``."""
    nonce = os.urandom(NONCE_BYTES) if nonce is None else nonce
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"nonce must be {NONCE_BYTES} bytes")
    head = key_id(key) + struct.pack(">d", now) + nonce
    return head + _mac(key, head, payload)


def parse_auth(frame: bytes) -> tuple[bytes, float, bytes, bytes]:
    """(key_id, timestamp, nonce, mac) of an auth frame; ``AuthError`` when it has the wrong shape."""
    if len(frame) != AUTH_FRAME_BYTES:
        raise AuthError("bad_signature", f"auth frame of {len(frame)} bytes (expected {AUTH_FRAME_BYTES})")
    kid = frame[:KEY_ID_BYTES]
    (ts,) = struct.unpack(">d", frame[KEY_ID_BYTES:KEY_ID_BYTES + 8])
    nonce = frame[KEY_ID_BYTES + 8:KEY_ID_BYTES + 8 + NONCE_BYTES]
    return kid, ts, nonce, frame[-MAC_BYTES:]


def replay_verdict(ts: float, now: float, past: float, future: float) -> str:
    """'ok' when a timestamp is inside [now - past, now + future], else 'stale' (NaN included)."""
    return "ok" if now - past <= ts <= now + future else "stale"


class ReplayGuard:
    """Refuses timestamps more than ``window`` seconds old or ``max_future`` ahead of now, and
    nonces already seen within the window.

    Memory is bounded: when more than ``capacity`` nonces are live, the one with the
    *oldest timestamp* is forgotten and every timestamp up to its own is refused from then
    on (so a forgotten nonce can never be replayed). Forgetting by timestamp, not arrival,
    is what keeps one peer from moving the floor above everyone's clock: a message dated in
    the future is the last to be forgotten, never the floor, and it can be at most
    ``max_future`` ahead.
    """

    def __init__(self, window: float = DEFAULT_REPLAY_WINDOW, capacity: int = MAX_REMEMBERED_NONCES,
                 max_future: float = DEFAULT_MAX_FUTURE) -> None:
        if not window > 0:
            raise ValueError(f"replay window must be > 0 seconds, got {window!r}")
        if not 0 <= max_future <= window:
            raise ValueError(f"max_future must be in [0, window], got {max_future!r}")
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.window = float(window)
        self.max_future = float(max_future)
        self.capacity = capacity
        self._seen: dict[bytes, float] = {}  # nonce -> timestamp
        self._heap: list[tuple[float, bytes]] = []  # (timestamp, nonce), oldest timestamp first
        self._floor = float("-inf")  # timestamps <= floor are refused (their nonces may be forgotten)
        self._lock = threading.Lock()

    def check(self, ts: float, nonce: bytes, now: float) -> None:
        """Accept (and remember) or raise ``AuthError`` (kind ``stale`` or ``replayed``)."""
        if replay_verdict(ts, now, self.window, self.max_future) != "ok":
            raise AuthError("stale", f"timestamp {ts - now:+.1f}s away from now"
                                     f" (accepted: -{self.window:g}s .. +{self.max_future:g}s)")
        with self._lock:
            self._prune(now)
            if ts <= self._floor:
                raise AuthError("stale", "timestamp older than the remembered nonces")
            if nonce in self._seen:
                raise AuthError("replayed", "nonce already seen within the window (replayed message)")
            self._seen[nonce] = ts
            heapq.heappush(self._heap, (ts, nonce))
            while len(self._seen) > self.capacity:
                old, gone = heapq.heappop(self._heap)
                del self._seen[gone]
                self._floor = max(self._floor, old)

    def _prune(self, now: float) -> None:
        while self._heap and self._heap[0][0] < now - self.window:
            _, nonce = heapq.heappop(self._heap)
            del self._seen[nonce]

    @property
    def floor(self) -> float:
        return self._floor

    def __len__(self) -> int:
        return len(self._seen)


class KeyRing:
    """The current signing key plus retired keys still accepted until a deadline."""

    def __init__(
        self,
        key: bytes,
        *,
        grace_seconds: float = 30.0,
        loader: Optional[Callable[[], bytes]] = None,
        reload_seconds: float = 5.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        _check_key(key)
        if not grace_seconds >= 0:
            raise ValueError("grace_seconds must be >= 0")
        self.grace_seconds = float(grace_seconds)
        self._clock = clock
        self._loader = loader
        self._reload_seconds = float(reload_seconds)
        self._lock = threading.Lock()
        self._current = key
        self._retired: dict[bytes, tuple[bytes, float]] = {}  # key id -> (key, accepted until)
        self._last_load = clock()
        self._last_forced = float("-inf")
        self.rotations = 0

    @property
    def current(self) -> bytes:
        self._maybe_reload(force=False)
        return self._current

    def rotate(self, new_key: bytes, now: Optional[float] = None) -> bool:
        """Make ``new_key`` current; the old one stays accepted for ``grace_seconds``. False if unchanged."""
        _check_key(new_key)
        now = self._clock() if now is None else now
        with self._lock:
            if hmac.compare_digest(new_key, self._current):
                return False
            self._retired[key_id(self._current)] = (self._current, now + self.grace_seconds)
            self._retired.pop(key_id(new_key), None)
            self._current = new_key
            self.rotations += 1
            return True

    def lookup(self, kid: bytes, now: Optional[float] = None) -> Optional[bytes]:
        """The key with this id if it is accepted now, else None."""
        now = self._clock() if now is None else now
        self._maybe_reload(force=False)
        found = self._find(kid, now)
        if found is None and self._maybe_reload(force=True):
            found = self._find(kid, now)
        return found

    def accepted_ids(self, now: Optional[float] = None) -> list[bytes]:
        now = self._clock() if now is None else now
        with self._lock:
            return [key_id(self._current)] + [k for k, (_, until) in self._retired.items() if until > now]

    def accepted_keys(self, now: Optional[float] = None, *, refresh: bool = False) -> list[bytes]:
        """The current key and the retired ones still accepted (``refresh``: re-read the key file first, rate-limited)."""
        now = self._clock() if now is None else now
        self._maybe_reload(force=refresh)
        with self._lock:
            return [self._current] + [k for k, until in self._retired.values() if until > now]

    def _find(self, kid: bytes, now: float) -> Optional[bytes]:
        with self._lock:
            if hmac.compare_digest(kid, key_id(self._current)):
                return self._current
            for k in [k for k, (_, until) in self._retired.items() if until <= now]:
                del self._retired[k]
            entry = self._retired.get(kid)
            return entry[0] if entry is not None else None

    def _maybe_reload(self, *, force: bool) -> bool:
        """Re-read the key source when due; True when a new key was installed."""
        if self._loader is None:
            return False
        now = self._clock()
        with self._lock:
            if force:
                if now - self._last_forced < MIN_FORCED_RELOAD_SECONDS:
                    return False
                self._last_forced = now
            elif now - self._last_load < self._reload_seconds:
                return False
            self._last_load = now
        try:
            new = self._loader()
        except (OSError, ValueError):
            return False  # keep the keys we have; a half-written Secret file must not lock us out
        return self.rotate(new, now)


def _check_key(key: bytes) -> None:
    if not isinstance(key, bytes) or not key:
        raise ValueError("a side-channel key must be non-empty bytes")


def verify(
    ring: KeyRing, payload: bytes, frame: bytes, guard: Optional[ReplayGuard], *, now: float
) -> bytes:
    """Check one auth frame; return the id of the key that verified it, or raise ``AuthError``."""
    kid, ts, nonce, mac = parse_auth(frame)
    key = ring.lookup(kid, now)
    if key is None:
        raise AuthError("unknown_key", "signed with a key this side does not accept (wrong secret or rotated out)")
    if not hmac.compare_digest(_mac(key, frame[:-MAC_BYTES], payload), mac):
        raise AuthError("bad_signature", "wrong HMAC signature")
    if guard is not None:
        guard.check(ts, nonce, now)
    return kid
