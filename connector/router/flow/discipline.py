"""The router's queue discipline (pure: no clock, no I/O; every rule table-tested).

Requests wait in *flows*, one per (priority class, tenant). The edge (gate.py) enqueues every
request with ``offer`` and starts what ``dispatch`` returns; nothing starts around the queue, so
the order below is the only order.

- **Between classes: weighted, with headroom for the top class.** Classes share the fleet by
  weight through start-time fair queueing (SFQ) with unit cost per request: while several
  classes wait, a class of weight w gets w / (sum of the waiting classes' weights) of the
  dispatches, and a class that was idle starts at the current virtual time, so a lightly loaded
  high class is served at the next free slot instead of behind the backlog. Lower classes are
  dispatched only while ``headroom(capacity)`` slots stay free, so that a top-class request
  arriving at a saturated fleet finds a slot at once rather than waiting for one to end (the
  cost: lower classes alone use at most capacity - headroom). Weighted rather than strict, so
  that a busy high class cannot starve the others.
- **Within a class: round robin across tenants** (fair queueing with unit cost: the router does
  not know a request's length in advance), FIFO within a tenant.
- **Shedding** (the edge answers 429): a request queued ``max_wait_s`` is expired; when
  ``max_queued`` requests wait, an arrival displaces the newest request of the longest flow of
  the lowest waiting class below or equal to its own (among equally long flows, the one whose
  newest request came last), else it is refused itself (ties refuse the arrival, so a flow never
  displaces another as long as itself).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

QUEUE_FULL = "queue_full"  # refused on arrival: the queue is full of requests at least as important
DISPLACED = "displaced"  # was queued; a more important (or fairer) arrival took its place
QUEUE_TIMEOUT = "queue_timeout"  # waited max_wait_s without a slot
SHED_REASONS = (QUEUE_FULL, DISPLACED, QUEUE_TIMEOUT)


@dataclass(eq=False)
class Item:
    """One waiting request; ``token`` is the edge's (e.g. its future), opaque here."""

    tenant: str
    klass: int  # index into the classes, 0 = highest priority
    arrived: float  # the edge's monotonic clock
    token: Any = None
    queued: bool = field(default=False, init=False)


@dataclass(frozen=True)
class Offer:
    """What ``offer`` did: ``refused`` (the arrival itself was not queued) or queued it;
    ``displaced`` is a queued request it pushed out (shed with reason DISPLACED)."""

    refused: bool
    displaced: Optional[Item] = None


HEADROOM = 0.25  # share of capacity lower classes leave to the top class (see headroom())


def headroom(capacity: int, classes: int) -> int:
    """Slots lower classes leave free for the top class: a quarter of capacity, at least 1,
    never all of it (with one class, or a capacity of 1, none)."""
    if classes <= 1 or capacity <= 1:
        return 0
    return min(capacity - 1, max(1, int(capacity * HEADROOM)))


def retry_after_s(queued: int, capacity: int, mean_service_s: float, max_wait_s: float) -> int:
    """Retry-After for a shed request: the time the queue ahead takes to drain at the fleet's
    recent pace, in whole seconds, at least 1 and at most max_wait_s (rounded up)."""
    drain = queued / max(capacity, 1) * max(mean_service_s, 0.0)
    return int(min(max(1, math.ceil(drain)), max(1, math.ceil(max_wait_s))))


class _Class:
    __slots__ = ("weight", "flows", "ring", "start", "finish", "size")

    def __init__(self, weight: int) -> None:
        self.weight = weight
        self.flows: dict[str, deque[Item]] = {}
        self.ring: deque[str] = deque()  # tenants with waiting requests, in round-robin order
        self.start = 0.0  # SFQ start tag of the class's next dispatch (valid while backlogged)
        self.finish = 0.0  # SFQ finish tag of its last dispatch
        self.size = 0


class FlowQueue:
    def __init__(self, weights: Sequence[int], max_queued: int, max_wait_s: float) -> None:
        if not weights or any(w < 1 for w in weights):
            raise ValueError("weights: one positive weight per class, highest priority first")
        self.classes = [_Class(w) for w in weights]
        self.max_queued = max_queued
        self.max_wait_s = max_wait_s
        self.vtime = 0.0
        self._arrivals: deque[Item] = deque()  # every queued item in arrival order (lazy deletion)
        self.size = 0

    def queued(self, klass: int) -> int:
        return self.classes[klass].size

    # ---- arrival -----------------------------------------------------------

    def offer(self, item: Item) -> Offer:
        """Queue ``item``, or refuse it, displacing another when the queue is full."""
        displaced = None
        if self.size >= self.max_queued:
            displaced = self._victim(item)
            if displaced is None:
                return Offer(refused=True)
            self._remove(displaced)
        self._push(item)
        return Offer(refused=False, displaced=displaced)

    def _victim(self, item: Item) -> Optional[Item]:
        lowest = max(i for i, c in enumerate(self.classes) if c.size)
        if lowest < item.klass:
            return None  # everything waiting is more important
        flows = self.classes[lowest].flows
        # the longest flow; among equals, the one whose newest request came last
        candidates = [t for t in flows if not (lowest == item.klass and t == item.tenant)]
        if not candidates:
            return None
        longest = max(candidates, key=lambda t: (len(flows[t]), flows[t][-1].arrived))
        if lowest == item.klass and len(flows[longest]) <= len(flows.get(item.tenant, ())) + 1:
            return None  # the arrival's own flow would be (one of) the longest
        return flows[longest][-1]

    def _push(self, item: Item) -> None:
        c = self.classes[item.klass]
        if c.size == 0:
            c.start = max(self.vtime, c.finish)  # an idle class starts now, not in its past
        q = c.flows.get(item.tenant)
        if q is None:
            q = c.flows[item.tenant] = deque()
            c.ring.append(item.tenant)
        q.append(item)
        item.queued = True
        c.size += 1
        self.size += 1
        self._arrivals.append(item)

    def _remove(self, item: Item) -> None:
        c = self.classes[item.klass]
        q = c.flows[item.tenant]
        q.remove(item)
        self._unqueued(c, item, q)

    def _unqueued(self, c: _Class, item: Item, q: deque[Item]) -> None:
        item.queued = False
        c.size -= 1
        self.size -= 1
        if not q:
            del c.flows[item.tenant]
            c.ring.remove(item.tenant)

    # ---- leaving the queue ---------------------------------------------------

    def withdraw(self, item: Item) -> bool:
        """The client left while waiting: take it out. False if it was no longer queued."""
        if not item.queued:
            return False
        self._remove(item)
        return True

    def expire(self, now: float) -> list[Item]:
        """Requests that waited max_wait_s or longer, oldest first, taken out of the queue."""
        out = []
        while self._arrivals:
            head = self._arrivals[0]
            if not head.queued:
                self._arrivals.popleft()
                continue
            if now - head.arrived < self.max_wait_s:
                break
            self._arrivals.popleft()
            self._remove(head)
            out.append(head)
        return out

    def next_expiry(self) -> Optional[float]:
        """When the oldest waiting request expires (the edge's clock), or None when empty."""
        while self._arrivals and not self._arrivals[0].queued:
            self._arrivals.popleft()
        return self._arrivals[0].arrived + self.max_wait_s if self._arrivals else None

    def dispatch(self, in_flight: int, capacity: int) -> list[Item]:
        """Requests to start now, in order, given the requests in flight and the capacity."""
        out = []
        spare = headroom(capacity, len(self.classes))
        while self.size:
            eligible = [i for i, c in enumerate(self.classes)
                        if c.size and in_flight < capacity - (0 if i == 0 else spare)]
            if not eligible:
                break
            k = min(eligible, key=lambda i: (self.classes[i].start, i))
            out.append(self._pop(k))
            in_flight += 1
        return out

    def _pop(self, k: int) -> Item:
        c = self.classes[k]
        tenant = c.ring.popleft()
        q = c.flows[tenant]
        item = q.popleft()
        c.ring.append(tenant)  # to the back; _unqueued drops it if its flow is now empty
        self._unqueued(c, item, q)
        self.vtime = c.start
        c.finish = c.start + 1.0 / c.weight
        c.start = c.finish
        return item
