"""Decode side: posting one pull's NIXL READs and reading their states.

A pull's READs cover its blocks with contiguous runs coalesced: from the peer's prepared lists
(block indices only, ``prepped.py``) when it has them, else from descriptor lists built for this
pull (``descriptors.build_descriptors``). Each READ carries the completion notification the source
counts (``wire.Notif``: which reader, which part, the lease id). Time spent is counted per step,
and a finished pull's bytes and time once it completes.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

from pdfleet.connector.transfer import pull_state as ps
from pdfleet.connector.transfer import wire
from pdfleet.connector.transfer.descriptors import build_descriptors
from pdfleet.connector.transfer.layout import Region
from pdfleet.connector.transfer.nixl_agent import NixlAgent
from pdfleet.connector.transfer.peers import Peer
from pdfleet.connector.transfer.prepped import pull_indices
from pdfleet.contract.connector_counters import SinkCounters

__all__ = ["ReadPoster"]

log = logging.getLogger("pdfleet.connector.transfer.sink.reads")  # under the sink's logger: its level applies


class ReadPoster:
    def __init__(self, agent: NixlAgent, regions: Sequence[Region], local_lists: dict[str, Any],
                 counts: SinkCounters) -> None:
        self._agent = agent
        self._regions = list(regions)
        self._local_lists = local_lists  # the sink's own prepared lists, by memory type
        self._counts = counts
        self._reported_peers: set[str] = set()  # agents whose first transfer was logged

    def post(self, peer: Peer, request_id: str, lease_id: bytes | None, local_ids: list[int],
             remote_ids: list[int], handles: list[Any]) -> tuple[int, int]:
        """Post the READs, appending each handle to ``handles`` as it is posted; returns (bytes,
        descriptors). Raises ``NixlError`` (``handles`` then holds those posted before it)."""
        c = self._counts
        t0 = time.perf_counter()
        agent, name = self._agent, peer.agent_name
        prepped = bool(peer.lists)
        if prepped:
            reads: list = pull_indices(peer.reads, local_ids, remote_ids)
            counts = [r.descriptors for r in reads]
            sizes = [r.nbytes for r in reads]
        else:
            reads = build_descriptors(self._regions, peer.regions, peer.plan, local_ids, remote_ids)
            counts = [len(loc) for _, _, loc, _ in reads]
            sizes = [int(loc[:, 1].sum()) for _, _, loc, _ in reads]
        t1 = time.perf_counter()
        c.post_desc_seconds += t1 - t0
        nbytes = descriptors = 0
        for j, read in enumerate(reads):
            notif = wire.encode_notif(wire.Notif(request_id, peer.plan.readers, peer.plan.reader_index,
                                                 len(reads), j, lease_id or b""))
            t1 = time.perf_counter()
            if prepped:
                handle = agent.make_read(name, self._local_lists[read.local_mem], read.local,
                                         peer.lists[read.remote_mem], read.remote, notif)
            else:
                lmem, rmem, loc, rem = read
                handle = agent.make_read_descs(name, lmem, loc, rmem, rem, notif)
            t2 = time.perf_counter()
            handles.append(agent.post(name, handle))
            c.post_create_seconds += t2 - t1
            c.post_submit_seconds += time.perf_counter() - t2
            nbytes += sizes[j]
            c.descriptors += counts[j]
            descriptors += counts[j]
        c.prepped_transfers += prepped
        c.post_seconds += time.perf_counter() - t0
        return nbytes, descriptors

    def states(self, handles: Sequence[Any], states: list[str]) -> None:
        """Bring ``states`` (one per handle, 'PROC' for a new one) up to date; a DONE one is not asked again."""
        while len(states) < len(handles):
            states.append("PROC")
        for i, h in enumerate(handles):
            if states[i] != "DONE":
                states[i] = self._agent.state(h)

    def count_done(self, engine_id: str, peer: Peer | None, st: ps.PullState, descriptors: int) -> None:
        """Count a completed pull; the first from each peer is logged with its rate."""
        assert st.completed_at is not None
        seconds = st.completed_at - (st.posted_at or st.completed_at)
        c = self._counts
        c.bytes += st.nbytes
        c.transfers += 1
        c.transfer_seconds += seconds
        c.ack_wait_seconds += max(0.0, time.monotonic() - st.completed_at)
        if peer is not None and peer.agent_name not in self._reported_peers:
            self._reported_peers.add(peer.agent_name)
            log.info(
                "KV sink %s: first pull from %s: layout %s, %d descriptor(s), %d bytes, %.3g GB/s",
                engine_id, peer.engine_id, peer.layout.kv_cache_layout, descriptors,
                st.nbytes, st.nbytes / seconds / 1e9 if seconds > 0 else float("inf"),
            )
