"""Prefill side: ``KVSource`` registers the KV cache, answers handshakes, holds leases.

One per worker rank. The side channel listens on ``host:port + layout.tp_rank``
(``port`` is the base port shared by all ranks; port 0 picks a free port, for tests).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import asdict, replace
from typing import Sequence

from pdfleet.connector.transfer import wire
from pdfleet.connector.transfer.auth import KeyRing
from pdfleet.contract.connector_config import DEFAULTS as CONNECTOR_DEFAULTS, ConnectorExtraConfig
from pdfleet.connector.transfer.layout import (
    IncompatibleLayout,
    KVLayout,
    Region,
    Span,
    plan_slice,
    registration_spans,
)
from pdfleet.connector.transfer.leases import LeaseTable
from pdfleet.connector.transfer.nixl_agent import NixlAgent
from pdfleet.connector.transfer.sidechannel import SideChannelServer, check_bind_host
from pdfleet.contract.connector_counters import SourceCounters
from pdfleet.contract.kv_params import is_lease_id, lease_id_bytes

__all__ = ["KVSource"]

log = logging.getLogger(__name__)

# Heartbeats may name many requests at once, but not unboundedly many.
MAX_HEARTBEAT_IDS = 4096
# close(linger=...): the side channel must have been quiet this long before it closes.
QUIET_SECONDS = 1.0


class KVSource:
    """Prefill-side transfer endpoint of one worker rank.

    - ``start()``: registers ``regions`` with NIXL and starts the ZMQ side channel.
    - ``hold(request_id, block_ids) -> expiry`` (unix time, advertised; the lease itself runs on
      the monotonic clock): start a lease.
    - ``poll_released() -> [request_id]``: requests whose blocks may be freed now
      (every reader's completion notification arrived, or the lease expired).
    - ``stats() -> dict``: monotonic counters since start.
    """

    def __init__(
        self,
        *,
        engine_id: str,
        regions: Sequence[Region],
        layout: KVLayout,
        host: str,
        port: int,
        compat_hash: str,
        secret: "bytes | KeyRing | None",
        settings: ConnectorExtraConfig = CONNECTOR_DEFAULTS,  # the extra config: lease_seconds, backends
        allow_wildcard_bind: bool = False,
        nixl_progress_thread: bool = False,
        backing: Sequence[Span] | None = None,
    ) -> None:
        if not isinstance(engine_id, str) or not engine_id:
            raise ValueError("engine_id must be a non-empty string")
        if not regions:
            raise ValueError("regions must list at least one registered KV region")
        self.spans = registration_spans(regions, backing)
        if not isinstance(compat_hash, str):
            raise ValueError("compat_hash must be a string")
        if type(port) is not int or not 0 <= port <= 65535:
            raise ValueError(f"port must be an int in 0..65535, got {port!r}")
        self.engine_id = engine_id
        self.regions = list(regions)
        self.layout = layout
        self.host = check_bind_host(host, allow_wildcard_bind)
        self.compat_hash = compat_hash
        self.instance_id = uuid.uuid4().hex
        self.agent_name = f"pdfleet-src-{engine_id}-r{layout.tp_rank}-{self.instance_id[:12]}"
        self._leases = LeaseTable(settings.lease_seconds)
        self._backends = tuple(settings.backends)
        self._port_arg = port
        self._server = SideChannelServer(
            self.host,
            port + layout.tp_rank if port else 0,
            secret=secret,
            handler=self._handle,
            allow_wildcard=allow_wildcard_bind,
            tick=self._progress,
        )
        self._progress_thread = bool(nixl_progress_thread)
        self._last_message = 0.0
        self._agent: NixlAgent | None = None
        self._metadata = b""
        self._lock = threading.Lock()
        self._counts = SourceCounters()  # under _lock: the side-channel thread counts too

    @property
    def port(self) -> int:
        """Port the side channel of this rank listens on (after ``start``)."""
        return self._server.port

    @property
    def base_port(self) -> int:
        """The base port readers dial (they add the rank they read)."""
        return self._server.port - self.layout.tp_rank

    def start(self) -> None:
        self._agent = NixlAgent(self.agent_name, self._backends, progress_thread=self._progress_thread)
        self._agent.register(self.spans)
        self._metadata = self._agent.metadata()
        self._server.start()
        log.info(
            "KV source %s rank %d: layout %s, %d region(s) in %d registered allocation(s), side channel %s:%d",
            self.engine_id, self.layout.tp_rank, self.layout.kv_cache_layout, len(self.regions),
            len(self.spans), self.host, self.port,
        )

    # -- side-channel thread -------------------------------------------------
    # After ``start`` only this thread calls NIXL: it drains completion notifications
    # and, without NIXL's own progress thread (which spins a core), drives progress:
    # every millisecond while leases are held or a peer spoke recently, else every 50 ms.
    def _progress(self) -> float:
        agent = self._agent
        if agent is None:
            return 0.05
        for peer, msgs in agent.notifs().items():
            for raw in msgs:
                try:
                    n = wire.decode_notif(raw)
                except wire.BadMessage as exc:
                    with self._lock:
                        self._counts.notifs_rejected += 1
                    log.warning("KV source %s dropped a notification from %s: %s", self.engine_id, peer, exc)
                    continue
                self._leases.complete(n.request_id, n.readers, n.reader_index, n.parts, n.part, agent=str(peer),
                                      lease_id=n.lease_id or None)
        busy = len(self._leases) > 0 or time.monotonic() - self._last_message < 2.0
        return 0.001 if busy else 0.05

    def _handle(self, req: object) -> object:
        self._last_message = time.monotonic()
        if isinstance(req, wire.HeartbeatRequest):
            if len(req.request_ids) > MAX_HEARTBEAT_IDS:
                return wire.ErrorReply(id=req.id, reason=f"too many request ids (> {MAX_HEARTBEAT_IDS})")
            try:
                lids = wire.lease_id_list(req)
            except wire.BadMessage as exc:
                return wire.ErrorReply(id=req.id, reason=str(exc))
            with self._lock:
                self._counts.heartbeats += 1
            if req.release:
                self._leases.release(list(req.request_ids), req.agent, req.readers, lids)
            left, gone, by_you = self._leases.extend(req.request_ids, time.monotonic(), req.agent, req.readers,
                                                     lids, count=not req.release)
            return wire.HeartbeatReply(id=req.id, instance_id=self.instance_id, remaining=left, gone=gone,
                                       released_by_you=by_you)
        assert isinstance(req, wire.HandshakeRequest)
        reason = self._refusal(req)
        if reason:
            with self._lock:
                self._counts.handshakes_rejected += 1
            log.warning("KV source %s refused a handshake from %s: %s", self.engine_id, req.engine_id, reason)
            return wire.ErrorReply(id=req.id, reason=reason)
        with self._lock:
            self._counts.handshakes += 1
        return wire.HandshakeReply(
            id=req.id,
            engine_id=self.engine_id,
            instance_id=self.instance_id,
            agent_name=self.agent_name,
            agent_metadata=self._metadata,
            regions=self.regions,
            layout=self.layout,
            compat_hash=self.compat_hash,
            lease_seconds=self._leases.lease_seconds,
            clock=time.time(),
        )

    def _refusal(self, req: wire.HandshakeRequest) -> str:
        if req.version != wire.PROTOCOL_VERSION:
            return f"protocol version {req.version} is not supported (this source speaks {wire.PROTOCOL_VERSION})"
        try:
            # The reader's regions are checked on its side; here the layouts must fit.
            # Checked before the compat hash: a physical layout mismatch changes the hash
            # too (region count), and the layout reason is the one to act on.
            _check_layouts(req.layout, self.layout)
        except IncompatibleLayout as exc:
            return f"layout mismatch: {exc}"
        if req.compat_hash != self.compat_hash:
            return (
                f"compat hash mismatch: decode {req.compat_hash!r}, prefill {self.compat_hash!r}"
                " (different model/vLLM/cache config)"
            )
        return ""

    # -- engine thread -------------------------------------------------------
    def hold(self, request_id: str, block_ids: list[int], lease_id: bytes | None = None) -> float:
        """``lease_id`` (params 1.4): the hold's random id; only messages naming it act on the lease."""
        if not isinstance(request_id, str) or not request_id:
            raise ValueError("request_id must be a non-empty string")
        if lease_id is not None and not is_lease_id(lease_id):
            raise ValueError(f"lease_id must be {lease_id_bytes} bytes or None, got {lease_id!r}")
        with self._lock:
            self._counts.leases_held += 1
        # Leases run on the monotonic clock: a wall-clock step must never free blocks mid-READ.
        # The unix time returned is only advertised (remote_lease_expiry) as a lower bound.
        now_wall = time.time()
        self._leases.hold(request_id, block_ids, time.monotonic(), lease_id)
        return now_wall + self._leases.lease_seconds

    def release_unread(self, request_ids: list[str], lease_ids: list[bytes | None] | None = None) -> list[str]:
        """End leases that no decode will read (the router says so), unless a reader claimed them;
        ``lease_ids``: the lease id the router's params named for each (a lease with one needs it)."""
        return self._leases.release_unclaimed(request_ids, lease_ids)

    def keep_held(self, request_ids: list[str], lease_ids: list[bytes | None]) -> list[str]:
        """Extend these holds by the lease length from now, as a reader's heartbeat would, naming each one's
        lease id (the engine's own decision: the router keeps a turn's hold alive for the next turn)."""
        return self._leases.keep(request_ids, lease_ids, time.monotonic())

    def poll_released(self) -> list[str]:
        return self._leases.collect(time.monotonic())

    @property
    def healthy(self) -> str:
        """'' while the side channel serves; else why not (its loop gave up after repeated failures)."""
        if self._server.failed:
            return f"the side channel of {self.host}:{self.port} stopped: {self._server.failed}"
        return ""

    def stats(self) -> dict[str, float]:
        with self._lock:
            c = replace(self._counts)
        leases, server = self._leases, self._server
        c.leases_completed = float(leases.completed)
        c.leases_expired = float(leases.expired)
        c.leases_released = float(leases.released)
        c.leases_released_unread = float(leases.released_unread)
        c.unread_releases_refused = float(leases.unread_refused)
        c.lease_actions_refused = float(leases.refused)  # from agents a lease was not handed to
        # params 1.4: heartbeats, releases and notifications that named a held lease without its id,
        # and those that named a spent id (a replay, or a reader whose lease had ended)
        c.lease_proof_refused = float(leases.proof_refused)
        c.spent_lease_refused = float(leases.spent_refused)
        c.leases_active = float(len(leases))
        c.messages_rejected = float(server.rejected)
        c.messages_served = float(server.served)
        kinds = dict(server.rejected_by_kind)
        c.messages_unsigned = float(kinds.get("unsigned", 0))
        # unknown_peer_key: a connection refused at the CURVE handshake (no fleet key, or a wrong one)
        c.messages_bad_signature = float(kinds.get("bad_signature", 0) + kinds.get("unknown_key", 0)
                                         + kinds.get("unknown_peer_key", 0))
        c.messages_replayed = float(kinds.get("replayed", 0) + kinds.get("stale", 0))
        c.messages_too_deep = float(kinds.get("too_deep", 0))
        c.messages_malformed = float(kinds.get("malformed", 0))
        c.messages_oversized = float(kinds.get("oversized", 0))
        c.side_channel_loop_errors = float(server.loop_errors)
        c.side_channel_restarts = float(server.restarts)
        return asdict(c)

    def close(self, linger: float = 0.0) -> None:
        """Stop serving. With ``linger`` (seconds, at most), first keep answering until no lease is
        held and the side channel has been quiet for ``QUIET_SECONDS``: a draining prefill
        exits as soon as its last lease is released, while the decode whose completion released
        it may still wait for the heartbeat ack that confirms it (else it would recompute)."""
        deadline = time.monotonic() + max(0.0, linger)
        while time.monotonic() < deadline and (
            len(self._leases) > 0 or time.monotonic() - self._last_message < QUIET_SECONDS
        ):
            time.sleep(0.02)
        self._server.close()  # joins the thread that uses the agent
        if self._agent is not None:
            self._agent.close()
            self._agent = None


def _check_layouts(reader: KVLayout, source: KVLayout) -> None:
    """Layout checks that need no regions (the reader checks regions after the handshake)."""
    plan_slice(reader, [], source, [])
