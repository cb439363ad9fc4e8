"""ZMQ side channel: a ROUTER server thread on the source, a DEALER client on the sink.

The server answers handshake and heartbeat requests through a handler callback; a
message it will not accept (garbage, oversized, unsigned, wrongly signed) is dropped
and counted, and the server keeps serving. The client is non-blocking: ``submit``
sends, ``poll`` collects replies and resends or fails timed-out requests (bounded
attempts).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Callable

import zmq

from pdfleet.connector.transfer import auth, wire

__all__ = ["SideChannelServer", "SideChannelClient", "Call", "SideChannelError", "zmq_address", "check_bind_host",
           "reply_judged_at"]

log = logging.getLogger(__name__)

# Hard cap enforced by libzmq itself (it disconnects such peers); the codec's smaller
# limit is checked in Python so that oversized messages are counted.
_ZMQ_HARD_CAP = 64 * 1024 * 1024
_WILDCARDS = {"0.0.0.0", "::", "*", "[::]"}


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


class SideChannelError(RuntimeError):
    """The peer did not answer in time, answered garbage, or refused the request."""


def zmq_address(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


def check_bind_host(host: str, allow_wildcard: bool = False) -> str:
    if not isinstance(host, str) or not host.strip():
        raise ValueError(
            "side-channel host is empty: set VLLM_NIXL_SIDE_CHANNEL_HOST to this pod's IP"
        )
    host = host.strip()
    if host in _WILDCARDS and not allow_wildcard:
        raise ValueError(
            f"side-channel host {host!r} binds every interface; pass the pod IP"
            " (or allow_wildcard_bind=True to insist)"
        )
    return host


class SideChannelServer:
    """ROUTER socket on host:port served by a daemon thread.

    ``handler(request) -> reply`` and ``tick() -> seconds to wait`` run in the server thread; ``stats`` counts served
    requests and rejected messages (with the last reason in ``last_reject``).
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        secret: bytes | None,
        handler: Callable[[object], object],
        allow_wildcard: bool = False,
        tick: Callable[[], float] | None = None,
    ) -> None:
        self.host = check_bind_host(host, allow_wildcard)
        if type(port) is not int or not 0 <= port <= 65535:
            raise ValueError(f"side-channel port must be an int in 0..65535, got {port!r}")
        self._requested_port = port
        self.port = port
        self._req = wire.request_codec(secret)
        self._rep = wire.reply_codec(secret)
        self._handler = handler
        self._tick = tick  # called every loop turn in the server thread; returns the next wait (s)
        self._ctx = zmq.Context.instance()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: zmq.Socket | None = None
        self.served = 0
        self.rejected = 0
        self.rejected_by_kind: dict[str, int] = {}  # BadMessage.kind -> count (unsigned, replayed, ...)
        self.last_reject = ""

    def start(self) -> None:
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, _ZMQ_HARD_CAP)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        if ":" in self.host:
            sock.setsockopt(zmq.IPV6, 1)
        if self._requested_port == 0:
            base = zmq_address(self.host, 0).rsplit(":", 1)[0]
            self.port = sock.bind_to_random_port(base)
        else:
            try:
                sock.bind(zmq_address(self.host, self._requested_port))
            except zmq.ZMQError as exc:
                sock.close()
                raise SideChannelError(
                    f"cannot bind the side channel on {self.host}:{self._requested_port}: {exc}"
                ) from exc
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, name=f"pdfleet-sidechannel-{self.port}", daemon=True)
        self._thread.start()

    def _reject(self, reason: str, kind: str = "malformed") -> None:
        self.rejected += 1
        self.rejected_by_kind[kind] = self.rejected_by_kind.get(kind, 0) + 1
        self.last_reject = reason
        log.warning("side channel %s:%s dropped a message: %s", self.host, self.port, reason)

    def _serve(self) -> None:
        sock = self._sock
        assert sock is not None
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while not self._stop.is_set():
            wait = 0.1
            if self._tick is not None:
                try:
                    wait = self._tick()
                except Exception:
                    log.exception("side channel tick failed")
            try:
                if not poller.poll(max(0, int(wait * 1000))):
                    continue
                frames = sock.recv_multipart(zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                if self._stop.is_set():
                    break
                log.warning("side channel receive failed: %s", exc)
                continue
            identity, body = frames[0], frames[1:]
            envelope: list[bytes] = []
            if body and body[0] == b"":  # REQ-style delimiter
                envelope, body = [b""], body[1:]
            try:
                request, key_id = self._req.decode_signed(body)
            except wire.BadMessage as exc:
                self._reject(str(exc), exc.kind)
                continue
            try:
                reply = self._handler(request)
            except Exception as exc:  # a handler bug must not stop the server
                log.exception("side channel handler failed")
                reply = wire.ErrorReply(id=getattr(request, "id", 0), reason=f"internal error: {exc}")
            try:
                # Answer with the key the request was signed with: during a rotation the
                # asking peer may not know the new key yet.
                sock.send_multipart([identity, *envelope, *self._rep.encode(reply, key_id)], zmq.NOBLOCK)
                self.served += 1
            except (zmq.ZMQError, ValueError) as exc:
                log.warning("side channel reply failed: %s", exc)
        sock.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


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

    def __init__(self, *, secret: bytes | None, replay_window: float = auth.DEFAULT_REPLAY_WINDOW) -> None:
        self._req = wire.request_codec(secret)
        self._rep = wire.reply_codec(secret, replay_window=replay_window)
        self._ctx = zmq.Context.instance()
        self._socks: dict[tuple[str, int], zmq.Socket] = {}
        self._calls: dict[int, Call] = {}
        self.rejected = 0
        self.last_reject = ""

    @classmethod
    def next_id(cls) -> int:
        return next(cls._ids)

    def _socket(self, endpoint: tuple[str, int]) -> zmq.Socket:
        sock = self._socks.get(endpoint)
        if sock is None:
            host, port = endpoint
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, _ZMQ_HARD_CAP)
            sock.setsockopt(zmq.SNDHWM, 1000)
            if ":" in host:
                sock.setsockopt(zmq.IPV6, 1)
            try:
                sock.connect(zmq_address(host, port))
            except zmq.ZMQError as exc:
                sock.close(linger=0)
                raise SideChannelError(f"cannot connect to {host}:{port}: {exc}") from exc
            self._socks[endpoint] = sock
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
            self._socks[call.endpoint].send_multipart(self._req.encode(call.request), zmq.NOBLOCK)
        except zmq.ZMQError as exc:  # queue full: counts as a lost attempt
            call.last = f"send failed: {exc}"

    def _asked_at(self, endpoint: tuple[str, int]) -> float | None:
        """When the earliest call still waiting on ``endpoint`` was first sent (wall clock)."""
        return min((c.asked_at for c in self._calls.values() if c.endpoint == endpoint), default=None)

    def poll(self) -> None:
        """Receive replies (non-blocking), resend or fail timed-out calls."""
        for endpoint, sock in self._socks.items():
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
                    self.last_reject = str(exc)
                    log.warning("dropped a reply from %s:%s: %s", *endpoint, exc)
                    continue
                call = self._calls.get(getattr(reply, "id", None))
                if call is None or call.endpoint != endpoint:
                    continue  # late or duplicate reply
                del self._calls[reply.id]
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

    def pending(self) -> int:
        return len(self._calls)

    def close(self) -> None:
        for sock in self._socks.values():
            sock.close(linger=0)
        self._socks.clear()
        self._calls.clear()
