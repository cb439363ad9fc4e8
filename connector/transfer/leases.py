"""Lease table of the source: which requests' blocks are held, until when, by whom.

Thread-safe (the side-channel thread extends leases, the engine thread holds and
collects released ones). Time is passed in so the logic is testable without sleeping
(the source passes its monotonic clock).

A lease is bound to the readers that touch it first (issue 19): the first agent that
extends, completes or releases it claims it and says how many readers it reads with
(decode TP / prefill TP); up to that many agents may claim it. Only claimants extend,
release or complete it; anyone else is refused (counted). A release that arrives before
the hold is not remembered: it cannot end a lease that does not exist yet.

Single-use leases (params 1.4): a hold may carry a random lease id. Then only an extension,
release or completion that names that id acts on the lease (``proves``); one that names the
request without it, or with another id, is refused and counted (``proof_refused``). An id that
completed, was released or expired is spent: remembered (``SpentIds``, bounded in count and
age) and never extends, confirms or completes anything again (``spent_refused``); in particular
a spent 1.4 lease is never reported "released by you". Safety does not rest on that memory: a
live lease is matched by its exact random id, so a forgotten spent id can match nothing either
(its request is then merely "unknown" instead of "gone"). Early completions (before the hold)
are kept only for leases without an id: a 1.4 reader posts nothing before the source's grant.
"""

from __future__ import annotations

import hmac
import threading
from collections import OrderedDict
from dataclasses import dataclass, field

__all__ = ["LeaseTable", "SpentIds", "proves"]

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
    lease_id: bytes | None = None  # params 1.4: the hold's random id (None: a lease from before 1.4)


def proves(held: bytes | None, given: bytes | None) -> bool:
    """Whether an action naming lease id ``given`` may act on a lease held under ``held``. A lease with
    an id needs exactly that id; one without (before 1.4) is acted on only by actions without one."""
    if held is None or given is None:
        return held is None and given is None
    return hmac.compare_digest(held, given)


class SpentIds:
    """Lease ids that completed, were released or expired: at most ``limit``, each for ``ttl`` seconds
    (monotonic) after it was spent; the oldest go first. Not thread-safe (the table's lock guards it)."""

    def __init__(self, limit: int, ttl: float) -> None:
        if limit < 1 or not ttl > 0:
            raise ValueError(f"SpentIds needs limit >= 1 and ttl > 0, got {limit!r}, {ttl!r}")
        self.limit, self.ttl = limit, float(ttl)
        self._at: OrderedDict[bytes, float] = OrderedDict()

    def add(self, lease_id: bytes, now: float) -> None:
        self._at[lease_id] = now
        self._at.move_to_end(lease_id)
        self.prune(now)

    def prune(self, now: float) -> None:
        while self._at and (len(self._at) > self.limit or next(iter(self._at.values())) <= now - self.ttl):
            self._at.popitem(last=False)

    def __contains__(self, lease_id: object) -> bool:
        return lease_id in self._at

    def __len__(self) -> int:
        return len(self._at)

def may_act(claimants: set[str], cap: int, agent: str, readers: int) -> tuple[bool, int]:
    """(may ``agent`` act on a lease with these claimants, the cap from now on); a True answer for a
    newcomer means it joins the claimants."""
    if agent in claimants:
        return True, cap
    if not claimants:
        return True, max(1, min(int(readers), MAX_READERS))
    return len(claimants) < cap, cap


# How long a spent lease id is remembered, at least; and in leases (a replay of params that old is
# "unknown" to the source instead of "gone": it still gets no grant).
SPENT_MIN_SECONDS = 60.0
SPENT_LEASES = 4


class LeaseTable:
    def __init__(self, lease_seconds: float) -> None:
        if not lease_seconds > 0:
            raise ValueError(f"lease_seconds must be > 0, got {lease_seconds!r}")
        self.lease_seconds = float(lease_seconds)
        self._spent = SpentIds(RECENT_LIMIT, max(SPENT_MIN_SECONDS, SPENT_LEASES * self.lease_seconds))
        self._now = 0.0  # the latest time a caller passed in (when a spent id was spent, for its expiry)
        self._lock = threading.Lock()
        self._leases: dict[str, _Lease] = {}
        self._released: list[str] = []
        # Recently finished ids (bounded), so a heartbeat can tell "gone" from "not yet
        # held", and completions that arrive before the hold.
        # value: (its lease id, the agents whose completions released it: empty when it expired)
        self._gone: OrderedDict[str, tuple[bytes | None, frozenset[str]]] = OrderedDict()
        # request id -> (completions needed, seen, agents, readers announced)
        self._early: OrderedDict[str, tuple[int, set[tuple[int, int]], set[str], int]] = OrderedDict()
        self.expired = 0
        self.completed = 0
        self.released = 0  # ended by the reader's release notice (abort, nothing to pull)
        self.refused = 0  # extensions, releases and completions from agents the lease is not bound to
        self.early_releases_ignored = 0
        self.released_unread = 0  # ended because no decode will read them (router's word), unclaimed
        self.unread_refused = 0  # such releases of a lease a reader had claimed (it may be reading)
        self.proof_refused = 0  # actions naming a held lease without its lease id (missing or wrong)
        self.spent_refused = 0  # extensions and completions naming a spent lease id (a replay, or too late)

    def _tick(self, now: float) -> None:
        self._now = max(self._now, now)
        self._spent.prune(self._now)

    def _spent_id(self, lease_id: bytes | None) -> bool:
        return lease_id is not None and lease_id in self._spent
    def hold(self, request_id: str, block_ids: list[int], now: float, lease_id: bytes | None = None) -> float:
        with self._lock:
            self._tick(now)
            expires = now + self.lease_seconds
            self._gone.pop(request_id, None)
            needed, done, readers, announced = self._early.pop(request_id, (0, set(), set(), 0))
            if lease_id is not None:  # id-less early completions prove nothing about a 1.4 lease
                needed, done, readers, announced = 0, set(), set(), 0
            if needed and len(done) >= needed:  # every reader finished before the hold
                self._forget(request_id, readers)
                self._released.append(request_id)
                self.completed += 1
            else:
                cap = max(1, min(announced, MAX_READERS)) if readers else 0
                self._leases[request_id] = _Lease(list(block_ids), expires, done, readers, set(readers), cap,
                                                  lease_id)
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
        self, request_ids: list[str], now: float, agent: str = "", readers: int = 1,
        lease_ids: list[bytes | None] | None = None, count: bool = True,
    ) -> tuple[dict[str, float], list[str], list[str]]:
        """Extend live leases (``lease_ids``: the lease id named with each request, None for none;
        ``count``: count refusals, False when the same message's release already did).

        Returns (seconds left for each held request, ids that are gone: released or
        expired, the gone ids released by completions that include `agent`'s: leases without
        a lease id only). Ids in none are unknown (perhaps not held *yet*), or named without
        their lease's id (refused, counted: the asker learns nothing about the lease).
        """
        out: dict[str, float] = {}
        gone: list[str] = []
        by_agent: list[str] = []
        lids = lease_ids if lease_ids is not None else [None] * len(request_ids)
        with self._lock:
            self._tick(now)
            for rid, lid in zip(request_ids, lids):
                lease = self._leases.get(rid)
                if self._spent_id(lid):  # never a grant or a confirmation again
                    self.spent_refused += count
                    gone.append(rid)
                    continue
                if lease is not None and not proves(lease.lease_id, lid):
                    self.proof_refused += count
                    continue
                if lease is None or lease.expires_at <= now:
                    # expired leases are not revived: the blocks may be reused
                    if lease is not None or rid in self._gone:
                        gone.append(rid)
                        if lease is None and agent and lid is None:
                            held_id, completers = self._gone[rid]
                            if held_id is None and agent in completers:
                                by_agent.append(rid)
                    continue
                if not self._bind(lease, agent, readers):
                    continue  # not this agent's lease: it learns nothing about it
                out[rid] = self._prolong(lease, now)
        return out, gone, by_agent

    def _prolong(self, lease: _Lease, now: float) -> float:
        """A live lease runs ``lease_seconds`` from ``now`` (never shortened); the seconds left."""
        lease.expires_at = max(lease.expires_at, now + self.lease_seconds)
        return lease.expires_at - now

    def keep(self, request_ids: list[str], lease_ids: list[bytes | None], now: float) -> list[str]:
        """Extend these live leases like a reader's heartbeat, for their holder (a decode keeping a turn's
        blocks for the next one, asked by the router; issue 40), without binding any reader: the lease
        stays the next reader's to claim. Each must be named with its lease id; an expired one is not
        revived. Returns the ids extended."""
        out: list[str] = []
        with self._lock:
            self._tick(now)
            for rid, lid in zip(request_ids, lease_ids):
                lease = self._leases.get(rid)
                if lease is None or lease.expires_at <= now:
                    continue
                if lid is None or not proves(lease.lease_id, lid):
                    self.proof_refused += 1
                    continue
                self._prolong(lease, now)
                out.append(rid)
        return out

    def release(self, request_ids: list[str], agent: str = "", readers: int = 1,
                lease_ids: list[bytes | None] | None = None) -> list[str]:
        """End these leases now (the reader will not read them); returns the ids released.

        Only an agent the lease is bound to (or the first to touch it) may release it, naming its
        lease id if it has one. An id not held yet is ignored: the lease then runs its course (never
        poisoned in advance)."""
        out: list[str] = []
        lids = lease_ids if lease_ids is not None else [None] * len(request_ids)
        with self._lock:
            for rid, lid in zip(request_ids, lids):
                lease = self._leases.get(rid)
                if lease is None:
                    if rid not in self._gone and not self._spent_id(lid):
                        self.early_releases_ignored += 1
                    continue
                if not proves(lease.lease_id, lid):
                    if not self._spent_id(lid):  # an honest late release of an old lease is no attack
                        self.proof_refused += 1
                    continue
                if not self._bind(lease, agent, readers):
                    continue
                del self._leases[rid]
                self._forget(rid, lease_id=lease.lease_id)
                self._released.append(rid)
                self.released += 1
                out.append(rid)
        return out

    def release_unclaimed(self, request_ids: list[str], lease_ids: list[bytes | None] | None = None) -> list[str]:
        """End leases no reader has claimed (nobody will read them: the router gave up on decode);
        returns the ids released. A claimed lease runs its course: its reader may be reading, and
        only a reader's completion or its own release ends it early. Ids not held are ignored, and
        so is a lease whose id is not the one named (counted)."""
        out: list[str] = []
        lids = lease_ids if lease_ids is not None else [None] * len(request_ids)
        with self._lock:
            for rid, lid in zip(request_ids, lids):
                lease = self._leases.get(rid)
                if lease is None:
                    continue
                if not proves(lease.lease_id, lid):
                    self.proof_refused += 1
                    continue
                if lease.claimants or lease.done:
                    self.unread_refused += 1
                    continue
                del self._leases[rid]
                self._forget(rid, lease_id=lease.lease_id)
                self._released.append(rid)
                self.released_unread += 1
                out.append(rid)
        return out

    def _forget(self, request_id: str, completed_by: set[str] | frozenset[str] = frozenset(),
                lease_id: bytes | None = None) -> None:
        self._gone[request_id] = (lease_id, frozenset(completed_by))
        while len(self._gone) > RECENT_LIMIT:
            self._gone.popitem(last=False)
        if lease_id is not None:
            self._spent.add(lease_id, self._now)

    def complete(
        self, request_id: str, readers: int, reader_index: int, parts: int, part: int, agent: str = "",
        lease_id: bytes | None = None,
    ) -> bool:
        """Record one reader's completed read (naming ``lease_id``, if the reader has one); True when
        the request is released by it."""
        with self._lock:
            lease = self._leases.get(request_id)
            if self._spent_id(lease_id):
                self.spent_refused += 1
                return False
            if lease is not None and not proves(lease.lease_id, lease_id):
                self.proof_refused += 1
                return False
            if lease is None and lease_id is not None:  # a 1.4 reader reads only after its grant: no early one
                self.proof_refused += 1
                return False
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
                self._forget(request_id, lease.readers, lease.lease_id)
                self._released.append(request_id)
                self.completed += 1
                return True
            return False

    def collect(self, now: float) -> list[str]:
        """Request ids whose blocks may be freed now (completed, or lease expired)."""
        with self._lock:
            self._tick(now)
            for rid in [r for r, lease in self._leases.items() if lease.expires_at <= now]:
                lease = self._leases.pop(rid)
                self._forget(rid, lease_id=lease.lease_id)
                self._released.append(rid)
                self.expired += 1
            out, self._released = self._released, []
            return out

    def __len__(self) -> int:
        with self._lock:
            return len(self._leases)
