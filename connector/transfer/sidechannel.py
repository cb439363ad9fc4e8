"""ZMQ side channel: a ROUTER server thread on the source, a DEALER client on the sink.

The server answers handshake and heartbeat requests through a handler callback; a
message it will not accept (garbage, oversized, too deep, unsigned, wrongly signed) is
dropped and counted by reason (logged once per reason per interval), and the server
keeps serving: a fault in one loop turn is counted and the loop goes on, and should
the loop itself fail it is restarted (``alive`` says whether it still runs). The
client is non-blocking: ``submit`` sends, ``poll`` collects replies and resends or
fails timed-out requests (bounded attempts); it keeps at most ``max_sockets`` sockets
(least recently used first out, idle ones closed).

Memory a peer can cost (libzmq buffers an unfinished multipart message whole, however
many frames it has, and ``MAXMSGSIZE`` bounds one frame only): with a key, ZMQ's CURVE
mechanism runs first and a ZAP handler admits only clients whose CURVE key derives
from a fleet key the ring accepts, so a peer without the key never gets past the
handshake (no message frame is buffered for it); what it can make the server hold is
one handshake frame of at most ``MAXMSGSIZE`` per connection, dropped after
``HANDSHAKE_MS``. Complete messages queue at most ``RCVHWM`` per connection. The
CURVE server key is a published constant: CURVE here keeps keyless peers out; the
HMAC of every message (auth.py) is what authenticates the payload both ways.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import logging
import os
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from typing import Callable, Iterator

import zmq
from zmq.utils import z85

from pdfleet.connector.transfer import auth, bounds, wire

__all__ = ["SideChannelServer", "SideChannelClient", "Call", "SideChannelError", "zmq_address", "check_bind_host",
           "reply_judged_at"]

log = logging.getLogger(__name__)

# Hard cap enforced by libzmq itself (it disconnects such peers); the codec's smaller
# limit is checked in Python so that oversized messages are counted.
_ZMQ_HARD_CAP = 64 * 1024 * 1024
_WILDCARDS = {"0.0.0.0", "::", "*", "[::]"}
# Per-frame limits libzmq enforces (it disconnects the peer): a request frame is at most
# the codec's limit plus ZMTP/CURVE framing; a reply frame likewise.
SERVER_MAX_FRAME = wire.MAX_REQUEST_BYTES + 4096
CLIENT_MAX_FRAME = wire.MAX_REPLY_BYTES + 4096
SERVER_RCVHWM = 128  # complete messages queued per connection before libzmq stops reading it
CLIENT_RCVHWM = 64
HANDSHAKE_MS = 2000  # a connection that has not finished the ZMTP/CURVE handshake by then is dropped
MAX_SOCKETS = 256  # client sockets (one per endpoint) kept open at most
IDLE_SOCKET_SECONDS = 30.0  # a client socket with no call for this long is closed
DROP_LOG_INTERVAL = 10.0
_ZAP_DOMAIN = "pdfleet-side-channel"
_CURVE_SERVER_SECRET = z85.encode(hashlib.sha256(b"pdfleet-side-channel-curve-server-v1").digest())
CURVE_SERVER_PUBLIC = zmq.curve_public(_CURVE_SERVER_SECRET)


def curve_client_keys(key: bytes) -> tuple[bytes, bytes]:
    """(public, secret) CURVE keys (Z85) of a side-channel client holding fleet key ``key``."""
    secret = z85.encode(hmac.new(key, b"pdfleet-side-channel-curve-client-v1", hashlib.sha256).digest())
    return zmq.curve_public(secret), secret


def secure_client_socket(ctx: zmq.Context, secret: "bytes | auth.KeyRing | None", kind: int = zmq.DEALER) -> zmq.Socket:
    """A socket that can talk to a ``SideChannelServer`` with this secret (CURVE set up when keyed)."""
    sock = ctx.socket(kind)
    ring = wire.key_ring(secret)
    if ring is not None:
        public, private = curve_client_keys(ring.current)
        sock.curve_serverkey = CURVE_SERVER_PUBLIC
        sock.curve_publickey = public
        sock.curve_secretkey = private
    return sock


class _FleetClients:
    """ZAP credentials check: a CURVE client key derived from a fleet key the ring accepts."""

    def __init__(self, ring: auth.KeyRing, on_refuse: Callable[[str, str], None]) -> None:
        self._ring = ring
        self._on_refuse = on_refuse
        self._derived: dict[bytes, bytes] = {}

    def _publics(self, refresh: bool) -> set[bytes]:
        out = set()
        for key in self._ring.accepted_keys(refresh=refresh):
            pub = self._derived.get(key)
            if pub is None:
                if len(self._derived) > 64:
                    self._derived.clear()
                pub = self._derived[key] = curve_client_keys(key)[0]
            out.add(pub)
        return out

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self._publics(False) or key in self._publics(True):
            return True
        self._on_refuse("a client whose CURVE key derives from no accepted fleet key (no key, or a wrong one)",
                        "unknown_peer_key")
        return False


def pool_victim(entries: list[tuple[object, bool, bool]]) -> object:
    """Which socket to close when the pool is full. ``entries`` are (endpoint, busy, has answered)
    in least recently used order: an idle one first, else one that never answered (an endpoint
    that does not reply must not push out a healthy prefill), else the least recently used."""
    for ep, busy, _ in entries:
        if not busy:
            return ep
    for ep, _, answered in entries:
        if not answered:
            return ep
    return entries[0][0]


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


@contextmanager
def unpinned() -> Iterator[None]:
    """Threads started inside may run on every CPU the process may use, not only the caller's.

    vLLM pins an engine's worker thread to the engine's CPUs, and every thread it starts inherits
    that pinning, ZMQ's I/O threads included. Where engines share CPUs the side channel's threads
    then wait behind the engines' spinning threads and answer heartbeats seconds late (measured:
    p99 6-10 s in 2 prefill + 1 decode local fleets, docs/reliability.md). Started in here, they
    go wherever a CPU is free. The caller's own pinning is restored on the way out."""
    try:
        before = os.sched_getaffinity(0)
        os.sched_setaffinity(0, range(os.cpu_count() or 1))  # the kernel keeps only the CPUs allowed
    except (AttributeError, OSError):  # not Linux, or not allowed: leave the pinning as it is
        yield
        return
    try:
        yield
    finally:
        try:
            os.sched_setaffinity(0, before)
        except OSError:
            pass


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
        self._own_ctx = False
        self._auth = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._sock: zmq.Socket | None = None
        self._lock = threading.Lock()  # counters: the ZAP thread refuses peers too
        self._drops = bounds.DropLog(DROP_LOG_INTERVAL)
        self.served = 0
        self.rejected = 0
        self.rejected_by_kind: dict[str, int] = {}  # BadMessage.kind -> count (unsigned, replayed, ...)
        self.last_reject = ""
        self.loop_errors = 0  # faults caught in a loop turn (the turn's message is lost, the loop goes on)
        self.restarts = 0  # times the serving loop itself failed and was started again
        self.failed = ""  # why the serving loop stopped for good (empty while it runs)
        self.max_restarts = 20  # failures in a row before the loop gives up (the engine then reports it)

    def start(self) -> None:
        with unpinned():  # the ZAP thread, ZMQ's I/O threads and the serving thread (see unpinned)
            self._start()

    def _start(self) -> None:
        ring = self._req.ring
        if ring is not None:
            # One ZAP handler per context: a context of its own, so servers do not share one.
            from zmq.auth.thread import ThreadAuthenticator

            self._ctx, self._own_ctx = zmq.Context(), True
            self._auth = ThreadAuthenticator(self._ctx, log=logging.getLogger(__name__ + ".zap"))
            self._auth.start()
            self._auth.configure_curve_callback(_ZAP_DOMAIN, credentials_provider=_FleetClients(ring, self._reject))
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, SERVER_MAX_FRAME)
        sock.setsockopt(zmq.RCVHWM, SERVER_RCVHWM)
        sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        if ring is not None:
            sock.curve_server = True
            sock.curve_secretkey = _CURVE_SERVER_SECRET
            sock.zap_domain = _ZAP_DOMAIN.encode()
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
                self._close_ctx()
                raise SideChannelError(
                    f"cannot bind the side channel on {self.host}:{self._requested_port}: {exc}"
                ) from exc
        self._sock = sock
        self._thread = threading.Thread(target=self._run, name=f"pdfleet-sidechannel-{self.port}", daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """True while the serving loop runs (False before start, after close, or once it gave up)."""
        return self._thread is not None and self._thread.is_alive() and not self.failed

    def _reject(self, reason: str, kind: str = "malformed") -> None:
        with self._lock:
            self.rejected += 1
            self.rejected_by_kind[kind] = self.rejected_by_kind.get(kind, 0) + 1
            self.last_reject = reason
            held = self._drops.note(kind, time.monotonic())
        if held is not None:
            log.warning("side channel %s:%s dropped a message (%s): %s%s", self.host, self.port, kind, reason,
                        f" [and {held} more of this kind in the last {DROP_LOG_INTERVAL:g}s]" if held else "")

    def _run(self) -> None:
        """The serving loop, started again (with a pause) if it fails; gives up after many failures in a row."""
        failures = 0
        try:
            while not self._stop.is_set():
                try:
                    self._serve()
                    return
                except Exception as exc:  # never silently dead: counted, logged, restarted
                    failures += 1
                    with self._lock:
                        self.restarts += 1
                    log.exception("side channel %s:%s: serving loop failed (restart %d)", self.host, self.port,
                                  failures)
                    if failures >= self.max_restarts:
                        self.failed = f"serving loop failed {failures} times in a row: {exc!r}"
                        log.error("side channel %s:%s: %s; giving up", self.host, self.port, self.failed)
                        return
                    self._stop.wait(min(1.0, 0.01 * 2**failures))
        finally:
            if self._sock is not None:
                self._sock.close(linger=0)

    def _serve(self) -> None:
        sock = self._sock
        assert sock is not None
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        errors_in_row = 0
        while not self._stop.is_set():
            try:
                self._turn(sock, poller)
                errors_in_row = 0
            except (zmq.ContextTerminated, zmq.ZMQError) as exc:
                if self._stop.is_set():
                    return
                raise SideChannelError(f"socket failed: {exc}") from exc
            except Exception:  # a fault in one turn loses that message, not the server
                errors_in_row += 1
                with self._lock:
                    self.loop_errors += 1
                    held = self._drops.note("loop_error", time.monotonic())
                if held is not None:
                    log.exception("side channel %s:%s: a loop turn failed", self.host, self.port)
                if errors_in_row > 1000:
                    raise

    def _turn(self, sock: zmq.Socket, poller: zmq.Poller) -> None:
        wait = 0.1
        if self._tick is not None:
            try:
                wait = self._tick()
            except Exception:
                log.exception("side channel tick failed")
        if not poller.poll(max(0, int(wait * 1000))):
            return
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        identity, body = frames[0], frames[1:]
        envelope: list[bytes] = []
        if body and body[0] == b"":  # REQ-style delimiter
            envelope, body = [b""], body[1:]
        try:
            request, key_id = self._req.decode_signed(body)
        except wire.BadMessage as exc:
            self._reject(str(exc), exc.kind)
            return
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

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        self._close_ctx()

    def _close_ctx(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._own_ctx:
            self._ctx.destroy(linger=0)
            self._own_ctx = False


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
