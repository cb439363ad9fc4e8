"""Decode side: the sink's known prefill ranks (NIXL peers), the handshakes that make them, and
the descriptor lists prepared for them.

One ``Peers`` per ``KVSink``, used on the sink's thread only. A handshake (side channel, with
timeouts and bounded retries) checks the source's layout and compat hash, adds its NIXL agent
and prepares its remote descriptor lists once, so that a pull only names block indices
(``prepped.py``); a peer that cannot be prepared is still used, each READ building its own
lists. A dropped peer (its instance changed, a READ failed) takes its agent and lists with it,
so the next pull handshakes again (a restarted prefill gets a fresh agent).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from pdfleet.connector.transfer import wire
from pdfleet.contract.connector_counters import SinkCounters
from pdfleet.connector.transfer.layout import (
    BLOCK_OUTERMOST_LAYOUTS,
    IncompatibleLayout,
    KVLayout,
    Region,
    SlicePlan,
    plan_slice,
)
from pdfleet.connector.transfer.nixl_agent import NixlAgent, NixlError
from pdfleet.connector.transfer.prepped import PrepRows, ReadGroup, local_rows, read_groups, remote_rows
from pdfleet.connector.transfer.sidechannel import Call, SideChannelClient, SideChannelError

__all__ = ["Endpoint", "Peer", "Peers", "Handshaken"]

log = logging.getLogger("pdfleet.connector.transfer.sink.peers")  # under the sink's logger: its level applies

Endpoint = tuple[str, int]


@dataclass
class Peer:
    endpoint: Endpoint
    engine_id: str
    instance_id: str
    agent_name: str
    regions: list[Region]
    layout: KVLayout
    plan: SlicePlan
    lease_seconds: float
    min_blocks: int
    clock_offset: float = 0.0  # source unix time - local unix time (estimate)
    clock_error: float = float("inf")  # bound on the estimate's error (half the round trip)
    reads: list[ReadGroup] = field(default_factory=list)  # the READs of a pull from prepared lists
    lists: dict[str, Any] = field(default_factory=dict)  # memory type -> prepared remote list


@dataclass(frozen=True)
class Handshaken:
    """A finished handshake: the new peer, or why there is none."""

    endpoint: Endpoint
    peer: Peer | None
    error: str = ""


class Peers:
    """The peer cache of one sink: ``get``, ``handshake``, ``collect`` (finished handshakes),
    ``drop``; and the sink's own prepared descriptor lists (``local_lists``)."""

    def __init__(self, *, agent: NixlAgent, client: SideChannelClient, engine_id: str,
                 regions: Sequence[Region], layout: KVLayout, compat_hash: str,
                 handshake_timeout: float, handshake_retries: int, prepped_descriptors: bool,
                 counts: SinkCounters) -> None:
        self._agent = agent
        self._client = client
        self.engine_id = engine_id
        self.regions = list(regions)
        self.layout = layout
        self.compat_hash = compat_hash
        self._hs_timeout = handshake_timeout
        self._hs_retries = handshake_retries
        self._counts = counts
        self._peers: dict[Endpoint, Peer] = {}
        self._handshakes: dict[Endpoint, tuple[Call, float, float]] = {}
        # Descriptor lists prepared once (here, and per peer at handshake): a pull then only
        # names block indices (make_prepped_xfer), instead of building and checking two
        # descriptor lists per READ (initialize_xfer). Without them (prepped_descriptors=False,
        # or a backend that cannot prepare), each READ builds its own lists.
        self._local_rows: PrepRows | None = None
        self.local_lists: dict[str, Any] = {}
        if prepped_descriptors:
            try:
                self._local_rows = local_rows(self.regions)
                for mem, rows in self._local_rows.rows.items():
                    self.local_lists[mem] = self._agent.prep(None, rows, mem)
            except (NixlError, ValueError) as exc:
                log.warning("KV sink %s: descriptor lists cannot be prepared, each READ builds its own: %s",
                            engine_id, exc)
                for handle in self.local_lists.values():
                    self._agent.release_prepped(handle)
                self.local_lists = {}

    def __len__(self) -> int:
        return len(self._peers)

    def get(self, endpoint: Endpoint) -> Peer | None:
        return self._peers.get(endpoint)

    def handshake(self, endpoint: Endpoint) -> None:
        """Start a handshake with ``endpoint`` unless one is under way."""
        if endpoint in self._handshakes:
            return
        req = wire.HandshakeRequest(
            id=SideChannelClient.next_id(),
            version=wire.PROTOCOL_VERSION,
            engine_id=self.engine_id,
            compat_hash=self.compat_hash,
            layout=self.layout,
        )
        fut = self._client.submit(*endpoint, req, timeout=self._hs_timeout, attempts=self._hs_retries)
        self._handshakes[endpoint] = (fut, time.monotonic(), time.time())

    def collect(self) -> list[Handshaken]:
        """The handshakes finished since the last call; each new peer is cached."""
        out: list[Handshaken] = []
        for endpoint, (fut, started, sent_wall) in list(self._handshakes.items()):
            if not fut.done():
                continue
            del self._handshakes[endpoint]
            try:
                peer = self._make_peer(endpoint, fut.result())
                if peer.clock_error == float("inf") and fut.result().clock > 0:
                    # The source's clock was read between our send and now.
                    got = time.time()
                    peer.clock_offset = fut.result().clock - (sent_wall + got) / 2
                    peer.clock_error = (got - sent_wall) / 2
            except Exception as exc:  # any failure fails the waiting pulls, never the engine
                self._counts.handshake_failures += 1
                out.append(Handshaken(endpoint, None, f"handshake with {endpoint[0]}:{endpoint[1]} failed: {exc}"))
                continue
            self._counts.handshakes += 1
            self._counts.handshake_seconds += time.monotonic() - started
            self._peers[endpoint] = peer
            out.append(Handshaken(endpoint, peer))
        return out

    def drop(self, endpoint: Endpoint, why: str, count: bool = True) -> Peer | None:
        """Forget the peer at ``endpoint`` (its prepared lists and NIXL agent go); the dropped peer, if any."""
        peer = self._peers.pop(endpoint, None)
        if peer is None:
            return None
        log.info("dropping NIXL peer %s at %s:%d: %s", peer.agent_name, *endpoint, why)
        if count:
            self._counts.stale_agents_dropped += 1
        for handle in peer.lists.values():  # before the agent they were prepared for goes
            self._agent.release_prepped(handle)
        peer.lists = {}
        self._agent.remove_peer(peer.agent_name)
        return peer

    def close(self) -> None:
        for ep in list(self._peers):
            self.drop(ep, "closing", count=False)
        for handle in self.local_lists.values():
            self._agent.release_prepped(handle)
        self.local_lists = {}

    def _make_peer(self, endpoint: Endpoint, reply: object) -> Peer:
        if isinstance(reply, wire.ErrorReply):
            raise SideChannelError(f"refused by the source: {reply.reason}")
        if not isinstance(reply, wire.HandshakeReply):
            raise SideChannelError(f"unexpected reply {type(reply).__name__}")
        # Layouts first: a physical layout mismatch also changes the compat hash (region
        # count), and its reason is the one an operator can act on.
        plan = plan_slice(self.layout, self.regions, reply.layout, reply.regions)
        if reply.compat_hash != self.compat_hash:
            raise IncompatibleLayout(
                f"compat hash mismatch: decode {self.compat_hash!r}, prefill {reply.compat_hash!r}"
            )
        name = self._agent.add_peer(reply.agent_metadata)
        runs = "block" if not plan.whole_blocks else "block run"
        log.info(
            "KV sink %s: handshake with %s at %s:%d: layout %s (%s), %d region(s) per side:"
            " %d descriptor(s) per %s; reading %s",
            self.engine_id, reply.engine_id, endpoint[0], endpoint[1], reply.layout.kv_cache_layout,
            "block-outermost" if reply.layout.kv_cache_layout in BLOCK_OUTERMOST_LAYOUTS else "per-layer",
            len(reply.regions), len(reply.regions), runs,
            "whole blocks" if plan.whole_blocks else f"head slice {plan.reader_index + 1}/{plan.readers}",
        )
        peer = Peer(
            endpoint=endpoint,
            engine_id=reply.engine_id,
            instance_id=reply.instance_id,
            agent_name=name,
            regions=list(reply.regions),
            layout=reply.layout,
            plan=plan,
            lease_seconds=reply.lease_seconds,
            min_blocks=min(r.num_blocks for r in reply.regions),
        )
        self._prep_peer(peer)
        return peer

    def _prep_peer(self, peer: Peer) -> None:
        """Prepare the peer's descriptor lists once; on failure its READs build their own."""
        if not self.local_lists or self._local_rows is None:
            return
        t0 = time.perf_counter()
        try:
            rows = remote_rows(peer.regions, peer.plan)
            peer.reads = read_groups(self._local_rows, rows)
            for mem, array in rows.rows.items():
                peer.lists[mem] = self._agent.prep(peer.agent_name, array, mem)
            if any(g.local_mem not in self.local_lists for g in peer.reads):
                raise NixlError("a local memory type has no prepared list")
        except (NixlError, ValueError) as exc:
            log.warning("KV sink %s: descriptor lists of %s cannot be prepared, each READ builds its own: %s",
                        self.engine_id, peer.agent_name, exc)
            for handle in peer.lists.values():
                self._agent.release_prepped(handle)
            peer.lists, peer.reads = {}, []
        self._counts.prep_seconds += time.perf_counter() - t0
