"""The side channel's client: non-blocking request/reply on the sink, one DEALER socket per endpoint.

``submit`` sends, ``poll`` collects replies and resends or fails timed-out requests (bounded
attempts); at most ``max_sockets`` sockets are kept (pool.py picks which goes; idle ones are closed).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import OrderedDict

import zmq

from pdfleet.connector.transfer import auth, bounds, wire
from pdfleet.connector.transfer.sidechannel.addresses import zmq_address
from pdfleet.connector.transfer.sidechannel.curve_keys import secure_client_socket
from pdfleet.connector.transfer.sidechannel.errors import SideChannelError
from pdfleet.connector.transfer.sidechannel.limits import (
    CLIENT_MAX_FRAME,
    CLIENT_RCVHWM,
    DROP_LOG_INTERVAL,
    HANDSHAKE_MS,
    IDLE_SOCKET_SECONDS,
    MAX_SOCKETS,
)
from pdfleet.connector.transfer.sidechannel.pool import pool_victim

__all__ = ["Call", "SideChannelClient", "reply_judged_at"]

log = logging.getLogger(__package__)  # the package's one logger name, as before the split


def reply_judged_at(signed_at: float, asked_at: float | None, now: float) -> float:
    """The time a reply's timestamp is judged against: when it could first have been read.

    A reply is read when the thread that owns the client polls, which can be long after it
    arrived (an engine step, a blocking call). Judged against that late ``now`` a fresh answer
    looks stale and is dropped, and the pull waiting for it fails. A reply signed after the
    earliest request still waiting on that peer (``asked_at``) cannot be a replay of an
    answer from before it, so it is judged as if read the moment it was signed; one signed
    earlier is judged from ``asked_at``, one from the future from ``now`` (the replay window
    bounds both). Wall-clock seconds, like the signatures' timestamps.
    """
    if asked_at is None:
        return now
    return min(max(signed_at, asked_at), now)


class Call:
    """One outstanding request: ``done()``, then ``result()`` (reply, or raises ``SideChannelError``)."""

    __slots__ = ("endpoint", "request", "timeout", "attempts_left", "attempts", "deadline", "asked_at",
                 "_reply", "_error", "_done", "last")

    def __init__(self, endpoint: tuple[str, int], request, timeout: float, attempts: int) -> None:
        self.endpoint = endpoint
        self.request = request
        self.timeout = timeout
        self.attempts = attempts
        self.attempts_left = attempts
        self.deadline = 0.0
        self.asked_at = time.time()  # wall clock, like the replies' signature timestamps
        self.last = f"no reply within {timeout:.3g}s"
        self._reply = None
        self._error: str | None = None
        self._done = False

    def done(self) -> bool:
        return self._done

    def result(self):
        if not self._done:
            raise SideChannelError("call still in progress")
        if self._error is not None:
            raise SideChannelError(self._error)
        return self._reply

    def _finish(self, reply=None, error: str | None = None) -> None:
        self._reply, self._error, self._done = reply, error, True


class SideChannelClient:
    """Non-blocking request/reply over one DEALER socket per endpoint, driven by ``poll``.

    Single-threaded by design (the engine thread sends and polls): no thread hand-offs,
    so a reply is seen on the next ``poll`` instead of waiting for the GIL. A request
    without a reply is resent after ``timeout`` on the same socket (libzmq reconnects
    by itself) until ``attempts`` are used up; replies are matched by request id and
    duplicates or late replies are ignored.
    """

    _ids = itertools.count(1)

    def __init__(self, *, secret: "bytes | auth.KeyRing | None", max_sockets: int = MAX_SOCKETS,
                 idle_seconds: float = IDLE_SOCKET_SECONDS,
                 replay_window: float = auth.DEFAULT_REPLAY_WINDOW) -> None:
        if type(max_sockets) is not int or max_sockets < 1:
            raise ValueError(f"max_sockets must be an int >= 1, got {max_sockets!r}")
        self._req = wire.request_codec(secret)
        self._rep = wire.reply_codec(secret, replay_window=replay_window)
        self._ring = self._req.ring
        self._ctx = zmq.Context.instance()
        # endpoint -> (socket, fleet key its CURVE keys derive from), least recently used first
        self._socks: OrderedDict[tuple[str, int], tuple[zmq.Socket, bytes | None]] = OrderedDict()
        self._used: dict[tuple[str, int], float] = {}
        self._answered: set[tuple[str, int]] = set()  # endpoints whose socket got a valid reply
        self._calls: dict[int, Call] = {}
        self._max_sockets = max_sockets
        self._idle = float(idle_seconds)
        self._drops = bounds.DropLog(DROP_LOG_INTERVAL)
        self.rejected = 0
        self.rejected_by_kind: dict[str, int] = {}
        self.last_reject = ""
        self.sockets_closed = 0  # idle or evicted sockets closed (the pool's bound at work)
        self._last_sweep = time.monotonic()

    @classmethod
    def next_id(cls) -> int:
        return next(cls._ids)

    def sockets(self) -> int:
        return len(self._socks)

    def _busy(self) -> set[tuple[str, int]]:
        return {c.endpoint for c in self._calls.values()}

    def _close_socket(self, endpoint: tuple[str, int]) -> None:
        sock, _ = self._socks.pop(endpoint)
        self._used.pop(endpoint, None)
        self._answered.discard(endpoint)
        sock.close(linger=0)
        self.sockets_closed += 1
        for rid, call in list(self._calls.items()):  # calls on it can no longer be answered
            if call.endpoint == endpoint:
                del self._calls[rid]
                call._finish(error=f"side channel {endpoint[0]}:{endpoint[1]}: socket closed to make room"
                                   f" (at most {self._max_sockets} side-channel endpoints at once)")

    def _socket(self, endpoint: tuple[str, int]) -> zmq.Socket:
        key = self._ring.current if self._ring is not None else None
        entry = self._socks.get(endpoint)
        if entry is not None and entry[1] != key and endpoint not in self._busy():
            self._close_socket(endpoint)  # the fleet key rotated: reconnect with the new CURVE keys
            entry = None
        if entry is not None:
            self._socks.move_to_end(endpoint)
            self._used[endpoint] = time.monotonic()
            return entry[0]
        if len(self._socks) >= self._max_sockets:
            busy = self._busy()
            self._close_socket(pool_victim([(ep, ep in busy, ep in self._answered) for ep in self._socks]))
        host, port = endpoint
        try:
            sock = secure_client_socket(self._ctx, self._ring)
        except zmq.ZMQError as exc:  # e.g. out of file descriptors: fail this call, not the caller
            raise SideChannelError(f"cannot open a socket for {host}:{port}: {exc}") from exc
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, CLIENT_MAX_FRAME)
            sock.setsockopt(zmq.RCVHWM, CLIENT_RCVHWM)
            sock.setsockopt(zmq.SNDHWM, 1000)
            sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS * 2)
            if ":" in host:
                sock.setsockopt(zmq.IPV6, 1)
            sock.connect(zmq_address(host, port))
        except zmq.ZMQError as exc:
            sock.close(linger=0)
            raise SideChannelError(f"cannot connect to {host}:{port}: {exc}") from exc
        self._socks[endpoint] = (sock, key)
        self._used[endpoint] = time.monotonic()
        return sock

    def submit(self, host: str, port: int, request, *, timeout: float, attempts: int) -> Call:
        """Send ``request`` now; the returned call completes during a later ``poll``."""
        self._req.encode(request)  # raises ValueError for an oversized request, before anything is sent
        call = Call((host, port), request, timeout, max(1, attempts))
        try:
            self._socket(call.endpoint)
        except SideChannelError as exc:
            call._finish(error=str(exc))
            return call
        self._calls[request.id] = call
        self._send(call, time.monotonic())
        return call

    def _send(self, call: Call, now: float) -> None:
        call.attempts_left -= 1
        call.deadline = now + call.timeout
        try:
            # Signed afresh on every attempt: a resend must not look like a replay.
            self._socket(call.endpoint).send_multipart(self._req.encode(call.request), zmq.NOBLOCK)
        except zmq.Again:  # not connected (CURVE handshake not done or refused) or queue full: a lost attempt
            call.last = f"no reply within {call.timeout:.3g}s (not connected)"
        except (zmq.ZMQError, SideChannelError) as exc:
            call.last = f"send failed: {exc}"

    def _asked_at(self, endpoint: tuple[str, int]) -> float | None:
        """When the earliest call still waiting on ``endpoint`` was first sent (wall clock)."""
        return min((c.asked_at for c in self._calls.values() if c.endpoint == endpoint), default=None)

    def poll(self) -> None:
        """Receive replies (non-blocking), resend or fail timed-out calls."""
        for endpoint, (sock, _) in tuple(self._socks.items()):
            asked_at = self._asked_at(endpoint)
            for _ in range(1000):  # bounded per poll
                try:
                    frames = sock.recv_multipart(zmq.NOBLOCK)
                except zmq.Again:
                    break
                except zmq.ZMQError as exc:
                    log.warning("side channel %s:%s receive failed: %s", *endpoint, exc)
                    break
                now = time.time()
                if len(frames) == 2 and len(frames[1]) == auth.AUTH_FRAME_BYTES:
                    now = reply_judged_at(auth.parse_auth(frames[1])[1], asked_at, now)
                try:
                    reply = self._rep.decode(frames, now)
                except wire.BadMessage as exc:
                    self.rejected += 1
                    self.rejected_by_kind[exc.kind] = self.rejected_by_kind.get(exc.kind, 0) + 1
                    self.last_reject = str(exc)
                    held = self._drops.note(exc.kind, time.monotonic())
                    if held is not None:
                        log.warning("dropped a reply from %s:%s (%s): %s%s", *endpoint, exc.kind, exc,
                                    f" [and {held} more of this kind in the last {DROP_LOG_INTERVAL:g}s]"
                                    if held else "")
                    continue
                call = self._calls.get(getattr(reply, "id", None))
                if call is None or call.endpoint != endpoint:
                    continue  # late or duplicate reply
                del self._calls[reply.id]
                self._answered.add(endpoint)
                call._finish(reply=reply)
        now = time.monotonic()
        for rid, call in list(self._calls.items()):
            if now < call.deadline:
                continue
            host, port = call.endpoint
            if call.attempts_left > 0:
                log.info("side channel %s:%s: %s, resending (%d left)", host, port, call.last, call.attempts_left)
                self._send(call, now)
                continue
            del self._calls[rid]
            call._finish(error=(
                f"side channel {host}:{port}: {call.last} after {call.attempts} attempt(s)"
                " (peer down, wrong address, or a secret mismatch: messages with a missing or wrong HMAC are dropped)"
            ))
        if now - self._last_sweep > 1.0:  # idle sockets: looked for once a second, not on every poll
            self._last_sweep = now
            busy = self._busy()
            for endpoint in [ep for ep, t in self._used.items() if now - t > self._idle and ep not in busy]:
                self._close_socket(endpoint)

    def pending(self) -> int:
        return len(self._calls)

    def close(self) -> None:
        for sock, _ in self._socks.values():
            sock.close(linger=0)
        self._socks.clear()
        self._used.clear()
        self._calls.clear()
