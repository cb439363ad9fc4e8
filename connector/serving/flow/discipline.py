"""The router's queue discipline (pure: no clock, no I/O; every rule table-tested).

Requests wait in *flows*, one per (priority class, tenant). The edge (gate.py) enqueues every
request with ``offer`` and starts what ``dispatch`` returns; nothing starts around the queue, so
the order below is the only order.

- **Fair by cost.** Every request carries a cost (the gate's estimate of the work it asks for:
  prompt tokens + ``max_tokens``, see cost.py; 1 when fairness counts requests). Shares below are
  shares of cost, not of requests: a tenant asking 4 times the tokens per request gets a quarter
  of the dispatches of an equal-rate neighbour, and both about the same decode time.
- **Between classes: weighted, with headroom for the top class.** Classes share the fleet by
  weight through start-time fair queueing (SFQ): while several classes wait, a class of weight w
  gets w / (sum of the waiting classes' weights) of the cost dispatched, and a class that was idle
  starts at the current virtual time, so a lightly loaded high class is served at the next free
  slot instead of behind the backlog. Lower classes are dispatched only while ``headroom(capacity)``
  slots stay free, so that a top-class request arriving at a saturated fleet finds a slot at once
  rather than waiting for one to end (the cost: lower classes alone use at most capacity -
  headroom). Weighted rather than strict, so that a busy high class cannot starve the others.
- **Within a class: SFQ across tenants** (equal weights; with unit costs, round robin), FIFO
  within a tenant. A tenant whose flow empties is forgotten (memory stays with what is queued); it
  starts again at the class's virtual time, so it gains at most one request's cost.
- **Waiting for decode** (issue 38): an admitted request whose prefill leg is over waits for a
  decode slot in a second queue of the same order (``decode_queue``), dispatched while decode holds
  fewer legs than its capacity, without headroom (kept at admission already); it is never full and
  only expires.
- **Shedding** (the edge answers 429): a request queued ``max_wait_s`` is expired; when
  ``max_queued`` requests wait, an arrival displaces the newest request of the longest flow of
  the lowest waiting class below or equal to its own (among equally long flows, the one whose
  newest request came last), else it is refused itself (ties refuse the arrival, so a flow never
  displaces another as long as itself).

Bounds (issue 31): memory is O(queued requests) whatever the arrival rate (nothing is kept for a
request that left the queue); an arrival, a dispatch, a withdrawal and an expiry each cost
O(log F) in the F flows of a class (heaps with lazy deletion, compacted when stale entries
outnumber live ones) plus O(classes), never a scan of the tenants.
"""

from __future__ import annotations

import heapq
import itertools
import math
import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Optional

QUEUE_FULL = "queue_full"  # refused on arrival: the queue is full of requests at least as important
DISPLACED = "displaced"  # was queued; a more important (or fairer) arrival took its place
QUEUE_TIMEOUT = "queue_timeout"  # waited max_wait_s without a slot
SHED_REASONS = (QUEUE_FULL, DISPLACED, QUEUE_TIMEOUT)


@dataclass(eq=False)
class Item:
    """One waiting request; ``token`` is the edge's (e.g. its future), opaque here; ``cost`` > 0."""

    tenant: str
    klass: int  # index into the classes, 0 = highest priority
    arrived: float  # the edge's monotonic clock (non-decreasing from one offer to the next)
    token: Any = None
    cost: float = 1.0
    queued: bool = field(default=False, init=False)
    seq: int = field(default=0, init=False)  # arrival order, set by offer


@dataclass(frozen=True)
class Offer:
    """What ``offer`` did: ``refused`` (the arrival itself was not queued) or queued it;
    ``displaced`` is a queued request it pushed out (shed with reason DISPLACED)."""

    refused: bool
    displaced: Optional[Item] = None


HEADROOM = 0.25  # share of capacity lower classes leave to the top class (see headroom())
_COMPACT_SLACK = 64  # a heap is rebuilt when its stale entries outnumber live ones by this much


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


class _Flow:
    """One tenant's waiting requests in one class, oldest first (O(1) removal anywhere)."""

    __slots__ = ("tenant", "items", "start")

    def __init__(self, tenant: str, start: float) -> None:
        self.tenant = tenant
        self.items: OrderedDict[Item, None] = OrderedDict()
        self.start = start  # SFQ start tag of its head request

    def head(self) -> Item:
        return next(iter(self.items))

    def newest(self) -> Item:
        return next(reversed(self.items))


class _Class:
    __slots__ = ("weight", "flows", "ready", "longest", "vtime", "start", "finish", "size")

    def __init__(self, weight: int) -> None:
        self.weight = weight
        self.flows: dict[str, _Flow] = {}
        # (start tag, tiebreak, flow): the flow to dispatch next; entries of gone flows are stale
        self.ready: list[tuple[float, int, _Flow]] = []
        # (-length, -newest seq, flow, length): the flow a full queue displaces from; stale when changed
        self.longest: list[tuple[int, int, int, _Flow]] = []
        self.vtime = 0.0  # start tag of the class's last dispatched request (tenants' SFQ)
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
        self._arrivals: OrderedDict[Item, None] = OrderedDict()  # every queued item, oldest first
        self._seq = itertools.count()
        self.size = 0

    def queued(self, klass: int) -> int:
        return self.classes[klass].size

    def entries(self) -> int:
        """Entries the queue holds in all its structures (for the memory bound's test and bench)."""
        return len(self._arrivals) + sum(len(c.ready) + len(c.longest) + sum(len(f.items) for f in c.flows.values())
                                         for c in self.classes)

    # ---- arrival -----------------------------------------------------------

    def offer(self, item: Item) -> Offer:
        """Queue ``item``, or refuse it, displacing another when the queue is full."""
        if not item.cost > 0:
            raise ValueError(f"cost: must be > 0, got {item.cost!r}")
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
        c = self.classes[lowest]
        own = c.flows.get(item.tenant) if lowest == item.klass else None
        longest = self._longest(c)
        if longest is own:  # the arrival's own flow is not a victim: look at the next one
            entry = heapq.heappop(c.longest)
            longest = self._longest(c)
            heapq.heappush(c.longest, entry)
        if longest is None:
            return None
        if lowest == item.klass and len(longest.items) <= (len(own.items) if own else 0) + 1:
            return None  # the arrival's own flow would be (one of) the longest
        return longest.newest()

    def _longest(self, c: _Class) -> Optional[_Flow]:
        while c.longest:
            _neg_len, neg_seq, length, flow = c.longest[0]
            if c.flows.get(flow.tenant) is flow and len(flow.items) == length and flow.newest().seq == -neg_seq:
                return flow
            heapq.heappop(c.longest)  # stale: the flow changed or left since
        return None

    def _push(self, item: Item) -> None:
        c = self.classes[item.klass]
        if c.size == 0:
            c.start = max(self.vtime, c.finish)  # an idle class starts now, not in its past
        flow = c.flows.get(item.tenant)
        if flow is None:
            flow = c.flows[item.tenant] = _Flow(item.tenant, c.vtime)
            self._ready(c, flow)
        item.seq = next(self._seq)
        flow.items[item] = None
        item.queued = True
        c.size += 1
        self.size += 1
        self._arrivals[item] = None
        self._changed(c, flow)

    def _ready(self, c: _Class, flow: _Flow) -> None:
        heapq.heappush(c.ready, (flow.start, next(self._seq), flow))
        if len(c.ready) > 2 * len(c.flows) + _COMPACT_SLACK:
            c.ready = [e for e in c.ready if c.flows.get(e[2].tenant) is e[2]]
            heapq.heapify(c.ready)

    def _changed(self, c: _Class, flow: _Flow) -> None:
        """The flow's length or newest request changed: a fresh entry in the displacement heap."""
        if flow.items:
            heapq.heappush(c.longest, (-len(flow.items), -flow.newest().seq, len(flow.items), flow))
        if len(c.longest) > 2 * len(c.flows) + _COMPACT_SLACK:
            c.longest = [(-len(f.items), -f.newest().seq, len(f.items), f) for f in c.flows.values()]
            heapq.heapify(c.longest)

    def _remove(self, item: Item) -> None:
        c = self.classes[item.klass]
        flow = c.flows[item.tenant]
        del flow.items[item]
        self._unqueued(c, item, flow)

    def _unqueued(self, c: _Class, item: Item, flow: _Flow) -> None:
        item.queued = False
        c.size -= 1
        self.size -= 1
        self._arrivals.pop(item, None)
        if not flow.items:
            del c.flows[item.tenant]  # its heap entries are stale from now on
        else:
            self._changed(c, flow)

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
            head = next(iter(self._arrivals))
            if now - head.arrived < self.max_wait_s:
                break
            self._remove(head)
            out.append(head)
        return out

    def next_expiry(self) -> Optional[float]:
        """When the oldest waiting request expires (the edge's clock), or None when empty."""
        return next(iter(self._arrivals)).arrived + self.max_wait_s if self._arrivals else None

    def dispatch(self, in_flight: int, capacity: int, lower_capacity: Optional[int] = None,
                 spare: Optional[int] = None) -> list[Item]:
        """Requests to start now, in order, given the requests in flight and the capacity.
        ``lower_capacity`` (at most ``capacity``; default: the same) is the bound the lower classes'
        headroom is taken from: the edge keeps the surplus it lets through ahead of decode for the top class.
        ``spare``: the slots lower classes leave free (default: ``headroom``)."""
        out = []
        spare = headroom(capacity, len(self.classes)) if spare is None else spare
        lower = capacity if lower_capacity is None else min(capacity, lower_capacity)
        while self.size:
            eligible = [i for i, c in enumerate(self.classes)
                        if c.size and in_flight < (capacity if i == 0 else lower - spare)]
            if not eligible:
                break
            k = min(eligible, key=lambda i: (self.classes[i].start, i))
            out.append(self._pop(k))
            in_flight += 1
        return out

    def _pop(self, k: int) -> Item:
        c = self.classes[k]
        while True:
            start, _tie, flow = heapq.heappop(c.ready)
            if c.flows.get(flow.tenant) is flow:
                break
        item = flow.items.popitem(last=False)[0]
        c.vtime = start
        flow.start = start + item.cost  # the flow's next request starts where this one ends
        self._unqueued(c, item, flow)
        if flow.items:
            self._ready(c, flow)
        self.vtime = c.start
        c.finish = c.start + item.cost / c.weight
        c.start = c.finish
        return item


def decode_queue(weights: Sequence[int], max_wait_s: float) -> FlowQueue:
    """The queue of admitted requests waiting for a decode slot (their prefill leg is over): the same
    order as admission (classes by weight, tenants by cost, FIFO within a tenant), never full (it holds
    only admitted requests, which the admission queue bounds), a wait of ``max_wait_s`` at most. Dispatch
    it with ``spare=0``: the top class's headroom was kept at admission; kept again here, lower classes
    alone would leave a quarter of decode idle."""
    return FlowQueue(weights, sys.maxsize, max_wait_s)
