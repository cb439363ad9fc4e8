"""Lease table of the source: which requests' blocks are held, until when, by whom.

Thread-safe (the side-channel thread extends leases, the engine thread holds and
collects released ones). Time is passed in so the logic is testable without sleeping
(the source passes its monotonic clock).

A lease is bound to the readers that touch it first (issue 19): the first agent that
extends, completes or releases it claims it and says how many readers it reads with
(decode TP / prefill TP); up to that many agents may claim it. Only claimants extend,
release or complete it; anyone else is refused (counted). A release that arrives before
the hold is not remembered: it cannot end a lease that does not exist yet.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["LeaseTable"]

RECENT_LIMIT = 65536


MAX_READERS = 1024  # readers per source rank a claim may announce (as a notification's bound)


@dataclass
class _Lease:
    block_ids: list[int]
    expires_at: float
    done: set[tuple[int, int]] = field(default_factory=set)  # (reader_index, part) seen
    readers: set[str] = field(default_factory=set)  # agents whose completions arrived
    claimants: set[str] = field(default_factory=set)  # agents the lease is bound to
    cap: int = 0  # how many may claim it (announced by the first claim; 0 = unclaimed)


def may_act(claimants: set[str], cap: int, agent: str, readers: int) -> tuple[bool, int]:
    """(may ``agent`` act on a lease with these claimants, the cap from now on); a True answer for a
    newcomer means it joins the claimants."""
    if agent in claimants:
        return True, cap
    if not claimants:
        return True, max(1, min(int(readers), MAX_READERS))
    return len(claimants) < cap, cap


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
        # request id -> (completions needed, seen, agents, readers announced)
        self._early: OrderedDict[str, tuple[int, set[tuple[int, int]], set[str], int]] = OrderedDict()
        self.expired = 0
        self.completed = 0
        self.released = 0  # ended by the reader's release notice (abort, nothing to pull)
        self.refused = 0  # extensions, releases and completions from agents the lease is not bound to
        self.early_releases_ignored = 0
        self.released_unread = 0  # ended because no decode will read them (router's word), unclaimed
        self.unread_refused = 0  # such releases of a lease a reader had claimed (it may be reading)

    def hold(self, request_id: str, block_ids: list[int], now: float) -> float:
        with self._lock:
            expires = now + self.lease_seconds
            self._gone.pop(request_id, None)
            needed, done, readers, announced = self._early.pop(request_id, (0, set(), set(), 0))
            if needed and len(done) >= needed:  # every reader finished before the hold
                self._forget(request_id, readers)
                self._released.append(request_id)
                self.completed += 1
            else:
                cap = max(1, min(announced, MAX_READERS)) if readers else 0
                self._leases[request_id] = _Lease(list(block_ids), expires, done, readers, set(readers), cap)
            return expires

    def _bind(self, lease: _Lease, agent: str, readers: int) -> bool:
        ok, cap = may_act(lease.claimants, lease.cap, agent, readers)
        if ok:
            lease.claimants.add(agent)
            lease.cap = cap
        else:
            self.refused += 1
        return ok

    def extend(
        self, request_ids: list[str], now: float, agent: str = "", readers: int = 1
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
                if not self._bind(lease, agent, readers):
                    continue  # not this agent's lease: it learns nothing about it
                lease.expires_at = max(lease.expires_at, now + self.lease_seconds)
                out[rid] = lease.expires_at - now
        return out, gone, by_agent

    def release(self, request_ids: list[str], agent: str = "", readers: int = 1) -> list[str]:
        """End these leases now (the reader will not read them); returns the ids released.

        Only an agent the lease is bound to (or the first to touch it) may release it. An id
        not held yet is ignored: the lease then runs its course (never poisoned in advance)."""
        out: list[str] = []
        with self._lock:
            for rid in request_ids:
                lease = self._leases.get(rid)
                if lease is None:
                    if rid not in self._gone:
                        self.early_releases_ignored += 1
                    continue
                if not self._bind(lease, agent, readers):
                    continue
                del self._leases[rid]
                self._forget(rid)
                self._released.append(rid)
                self.released += 1
                out.append(rid)
        return out

    def release_unclaimed(self, request_ids: list[str]) -> list[str]:
        """End leases no reader has claimed (nobody will read them: the router gave up on decode);
        returns the ids released. A claimed lease runs its course: its reader may be reading, and
        only a reader's completion or its own release ends it early. Ids not held are ignored."""
        out: list[str] = []
        with self._lock:
            for rid in request_ids:
                lease = self._leases.get(rid)
                if lease is None:
                    continue
                if lease.claimants or lease.done:
                    self.unread_refused += 1
                    continue
                del self._leases[rid]
                self._forget(rid)
                self._released.append(rid)
                self.released_unread += 1
                out.append(rid)
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
                    early = self._early.setdefault(request_id, (readers * parts, set(), set(), readers))
                    early[1].add((reader_index, part))
                    early[2].add(agent)
                    while len(self._early) > RECENT_LIMIT:
                        self._early.popitem(last=False)
                return False
            if not self._bind(lease, agent, readers):
                return False  # a completion from a reader the lease was not handed to
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
