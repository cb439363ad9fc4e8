"""Lease table of the source: which requests' blocks are held, until when, by whom.

Thread-safe (the side-channel thread extends leases, the engine thread holds and
collects released ones). Time is passed in so the logic is testable without sleeping.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["LeaseTable"]

RECENT_LIMIT = 65536


@dataclass
class _Lease:
    block_ids: list[int]
    expires_at: float
    done: set[tuple[int, int]] = field(default_factory=set)  # (reader_index, part) seen
    readers: set[str] = field(default_factory=set)  # agents whose completions arrived


class LeaseTable:
    def __init__(self, lease_seconds: float) -> None:
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be > 0, got {lease_seconds!r}")
        self.lease_seconds = float(lease_seconds)
        self._lock = threading.Lock()
        self._leases: dict[str, _Lease] = {}
        self._released: list[str] = []
        # Recently finished ids (bounded), so a heartbeat can tell "gone" from "not yet
        # held", and completions that arrive before the hold.
        # value: the agents whose completions released it (empty when it expired)
        self._gone: OrderedDict[str, frozenset[str]] = OrderedDict()
        self._early: OrderedDict[str, tuple[int, set[tuple[int, int]], set[str]]] = OrderedDict()
        self._released_early: OrderedDict[str, None] = OrderedDict()  # released before the hold arrived
        self.expired = 0
        self.completed = 0
        self.released = 0  # ended by the reader's release notice (abort, nothing to pull)

    def hold(self, request_id: str, block_ids: list[int], now: float) -> float:
        with self._lock:
            expires = now + self.lease_seconds
            self._gone.pop(request_id, None)
            needed, done, readers = self._early.pop(request_id, (0, set(), set()))
            if request_id in self._released_early:  # the reader gave it up before the hold
                del self._released_early[request_id]
                self._forget(request_id)
                self._released.append(request_id)
                self.released += 1
            elif needed and len(done) >= needed:  # every reader finished before the hold
                self._forget(request_id, readers)
                self._released.append(request_id)
                self.completed += 1
            else:
                self._leases[request_id] = _Lease(list(block_ids), expires, done, readers)
            return expires

    def extend(
        self, request_ids: list[str], now: float, agent: str = ""
    ) -> tuple[dict[str, float], list[str], list[str]]:
        """Extend live leases.

        Returns (seconds left for each held request, ids that are gone: released or
        expired, the gone ids released by completions that include `agent`'s). Ids in
        none are unknown (perhaps not held *yet*).
        """
        out: dict[str, float] = {}
        gone: list[str] = []
        by_agent: list[str] = []
        with self._lock:
            for rid in request_ids:
                lease = self._leases.get(rid)
                if lease is None or lease.expires_at <= now:
                    # expired leases are not revived: the blocks may be reused
                    if lease is not None or rid in self._gone:
                        gone.append(rid)
                        if lease is None and agent and agent in self._gone[rid]:
                            by_agent.append(rid)
                    continue
                lease.expires_at = max(lease.expires_at, now + self.lease_seconds)
                out[rid] = lease.expires_at - now
        return out, gone, by_agent

    def release(self, request_ids: list[str]) -> list[str]:
        """End these leases now (the reader will not read them); returns the ids released.

        An id not held yet is remembered (bounded) and released as soon as it is held."""
        out: list[str] = []
        with self._lock:
            for rid in request_ids:
                lease = self._leases.pop(rid, None)
                if lease is not None:
                    self._forget(rid)
                    self._released.append(rid)
                    self.released += 1
                    out.append(rid)
                elif rid not in self._gone:
                    self._released_early[rid] = None
                    while len(self._released_early) > RECENT_LIMIT:
                        self._released_early.popitem(last=False)
        return out

    def _forget(self, request_id: str, completed_by: set[str] | frozenset[str] = frozenset()) -> None:
        self._gone[request_id] = frozenset(completed_by)
        while len(self._gone) > RECENT_LIMIT:
            self._gone.popitem(last=False)

    def complete(
        self, request_id: str, readers: int, reader_index: int, parts: int, part: int, agent: str = ""
    ) -> bool:
        """Record one reader's completed read; True when the request is released by it."""
        with self._lock:
            lease = self._leases.get(request_id)
            if lease is None:
                if request_id not in self._gone:  # arrived before the hold: keep it for then
                    early = self._early.setdefault(request_id, (readers * parts, set(), set()))
                    early[1].add((reader_index, part))
                    early[2].add(agent)
                    while len(self._early) > RECENT_LIMIT:
                        self._early.popitem(last=False)
                return False
            lease.done.add((reader_index, part))
            lease.readers.add(agent)
            if len(lease.done) >= readers * parts:
                del self._leases[request_id]
                self._forget(request_id, lease.readers)
                self._released.append(request_id)
                self.completed += 1
                return True
            return False

    def collect(self, now: float) -> list[str]:
        """Request ids whose blocks may be freed now (completed, or lease expired)."""
        with self._lock:
            for rid in [r for r, lease in self._leases.items() if lease.expires_at <= now]:
                del self._leases[rid]
                self._forget(rid)
                self._released.append(rid)
                self.expired += 1
            out, self._released = self._released, []
            return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)
