"""The side channel's server: a ROUTER socket on the source, served by a daemon thread.

It answers handshake and heartbeat requests through a handler callback; a message it will
not accept (garbage, oversized, too deep, unsigned, wrongly signed) is dropped and counted by
reason (logged once per reason per interval), and the server keeps serving: a fault in one
loop turn is counted and the loop goes on, and should the loop itself fail it is restarted
(``alive`` says whether it still runs). With a key, only fleet members get past the CURVE
handshake (curve_keys.py); what a peer can cost is bounded in limits.py.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

import zmq

from pdfleet.connector.transfer import bounds, wire
from pdfleet.connector.transfer.sidechannel.addresses import check_bind_host, zmq_address
from pdfleet.connector.transfer.sidechannel.affinity import unpinned
from pdfleet.connector.transfer.sidechannel.curve_keys import CURVE_SERVER_SECRET, ZAP_DOMAIN, FleetClients
from pdfleet.connector.transfer.sidechannel.errors import SideChannelError
from pdfleet.connector.transfer.sidechannel.limits import (
    DROP_LOG_INTERVAL,
    HANDSHAKE_MS,
    SERVER_MAX_FRAME,
    SERVER_RCVHWM,
)

__all__ = ["SideChannelServer"]

log = logging.getLogger(__package__)  # the package's one logger name, as before the split


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
            self._auth = ThreadAuthenticator(self._ctx, log=logging.getLogger(__package__ + ".zap"))
            self._auth.start()
            self._auth.configure_curve_callback(ZAP_DOMAIN, credentials_provider=FleetClients(ring, self._reject))
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, SERVER_MAX_FRAME)
        sock.setsockopt(zmq.RCVHWM, SERVER_RCVHWM)
        sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)
        if ring is not None:
            sock.curve_server = True
            sock.curve_secretkey = CURVE_SERVER_SECRET
            sock.zap_domain = ZAP_DOMAIN.encode()
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
