"""ZMQ side channel: a ROUTER server thread on the source, a DEALER client on the sink.

The server answers handshake and heartbeat requests through a handler callback; a
message it will not accept (garbage, oversized, unsigned, wrongly signed) is dropped
and counted, and the server keeps serving. The client sends one request and waits
for the matching reply with a timeout and a bounded number of attempts.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Callable

import zmq

from pdfleet.connector.transfer import wire

__all__ = ["SideChannelServer", "SideChannelClient", "SideChannelError", "zmq_address", "check_bind_host"]

log = logging.getLogger(__name__)

# Hard cap enforced by libzmq itself (it disconnects such peers); the codec's smaller
# limit is checked in Python so that oversized messages are counted.
_ZMQ_HARD_CAP = 64 * 1024 * 1024
_WILDCARDS = {"0.0.0.0", "::", "*", "[::]"}


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

    def _reject(self, reason: str) -> None:
        self.rejected += 1
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
                request = self._req.decode(body)
            except wire.BadMessage as exc:
                self._reject(str(exc))
                continue
            try:
                reply = self._handler(request)
            except Exception as exc:  # a handler bug must not stop the server
                log.exception("side channel handler failed")
                reply = wire.ErrorReply(id=getattr(request, "id", 0), reason=f"internal error: {exc}")
            try:
                sock.send_multipart([identity, *envelope, *self._rep.encode(reply)], zmq.NOBLOCK)
                self.served += 1
            except (zmq.ZMQError, ValueError) as exc:
                log.warning("side channel reply failed: %s", exc)
        sock.close(linger=0)

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


class SideChannelClient:
    """Blocking request/reply over DEALER sockets, one cached socket per (thread, endpoint).

    Safe to use from several threads (each gets its own sockets).
    """

    _ids = itertools.count(1)

    def __init__(self, *, secret: bytes | None) -> None:
        self._req = wire.request_codec(secret)
        self._rep = wire.reply_codec(secret)
        self._ctx = zmq.Context.instance()
        self._local = threading.local()
        self._all: list[zmq.Socket] = []
        self._lock = threading.Lock()
        self.rejected = 0
        self.last_reject = ""

    @classmethod
    def next_id(cls) -> int:
        return next(cls._ids)

    def _socket(self, host: str, port: int) -> zmq.Socket:
        cache = getattr(self._local, "socks", None)
        if cache is None:
            cache = self._local.socks = {}
        sock = cache.get((host, port))
        if sock is None:
            sock = self._ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, _ZMQ_HARD_CAP)
            if ":" in host:
                sock.setsockopt(zmq.IPV6, 1)
            sock.connect(zmq_address(host, port))
            cache[(host, port)] = sock
            with self._lock:
                self._all.append(sock)
        return sock

    def _drop_socket(self, host: str, port: int) -> None:
        sock = getattr(self._local, "socks", {}).pop((host, port), None)
        if sock is not None:
            sock.close(linger=0)
            with self._lock:
                if sock in self._all:
                    self._all.remove(sock)

    def call(self, host: str, port: int, request, *, timeout: float, attempts: int):
        """Send ``request`` and return the decoded reply, or raise ``SideChannelError``."""
        last = "no attempt made"
        for attempt in range(max(1, attempts)):
            sock = self._socket(host, port)
            try:
                sock.send_multipart(self._req.encode(request), zmq.NOBLOCK)
            except zmq.ZMQError as exc:
                # no peer connected yet (DEALER with no pipe): fall through to waiting
                if exc.errno != zmq.EAGAIN:
                    raise SideChannelError(f"sending to {host}:{port} failed: {exc}") from exc
                sock = None
            deadline = time.monotonic() + timeout
            while sock is not None:
                left = deadline - time.monotonic()
                if left <= 0 or not sock.poll(int(left * 1000) + 1, zmq.POLLIN):
                    break
                frames = sock.recv_multipart(zmq.NOBLOCK)
                try:
                    reply = self._rep.decode(frames)
                except wire.BadMessage as exc:
                    self.rejected += 1
                    self.last_reject = str(exc)
                    last = f"bad reply: {exc}"
                    continue
                if getattr(reply, "id", None) != request.id:
                    continue  # a late reply to an earlier, timed-out attempt
                return reply
            else:
                # could not even queue the message: wait a little before retrying
                time.sleep(min(timeout, 0.05))
            if last == "no attempt made" or not last.startswith("bad reply"):
                last = f"no reply within {timeout:.3g}s"
            # a fresh socket so that a dead connection or queued stale request is discarded
            self._drop_socket(host, port)
            log.info("side channel %s:%s attempt %d/%d: %s", host, port, attempt + 1, attempts, last)
        raise SideChannelError(
            f"side channel {host}:{port}: {last} after {max(1, attempts)} attempt(s)"
            " (peer down, wrong address, or a secret mismatch: messages with a missing or wrong HMAC are dropped)"
        )

    def close(self) -> None:
        with self._lock:
            for sock in self._all:
                sock.close(linger=0)
            self._all.clear()
