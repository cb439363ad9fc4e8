"""The flow-control gate: the asyncio edge of discipline.py, in front of the router's legs.

Two ways in, one queue, and a second wait before decode:

- ``async with gate.admit(headers, cost=...) as admission:`` (any front end: the router, the
  gateway's Endpoint Picker) waits until the queue discipline dispatches the request, or raises
  ``Shed`` (status 429, reason, retry_after_s, message) when it is shed; the slot is given back when
  the block ends, however it ends.
- ``gate.guard(headers, handler, cost=...)``: the router's form on top of it, which answers 429
  with Retry-After (OpenAI's error shape) itself.
- ``await gate.wait_for_decode(admission)``: a front end awaits it (serving/pipeline.py's decode slot
  step, through hold.py) where the decode leg is about to pick a decode. It returns once decode holds
  fewer legs than its capacity and the requests waiting for decode ahead of it (discipline.py's
  order) have theirs: decode never holds more than ``maxInFlightPerDecode`` x ready decodes (issue
  38; per decode, room.py keeps the pick off a full one). The wait is bounded by ``maxQueueSeconds``
  (then ``Shed``, queue_timeout).

Disabled, or with no serving revision known (capacity 0: the router answers its own 503 at once),
both let the request through at once and count nothing: the router as before.

Cost: ``cost`` is the request's estimated tokens (cost.py: ``estimate_cost``); with fairness
"requests", or when a front end gives none, a request costs the mean of the costs given lately
(1 until one is), so that unknown and known costs mix fairly.

Capacity, counted from what decode holds: decode takes ``maxInFlightPerDecode`` x the ready decode
endpoints of the serving revision. A request holds a decode from its decode leg on (a front end
says when, with ``decode_started()``), not during its prefill leg or the router's own delays; the
gate keeps decode full by letting a pipeline of requests through ahead of it, as many as decode
frees while one prefill leg runs (Little's law: capacity x mean pre-decode time / mean decode time,
with a margin, at most capacity). Until a front end reports decode legs, every admitted request counts as a decode
(no pipeline): the gate as before. The pipeline's surplus waits in ``wait_for_decode``, in class
order, not inside decode; the slot is decode's from the moment the wait grants it.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Optional

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pdfleet.connector.serving.errors import error_response
from pdfleet.connector.serving.flow import deadline
from pdfleet.contract.flow_control import FAIRNESS_COST, FlowControlConfig
from pdfleet.connector.serving.flow.discipline import (
    DISPLACED,
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    FlowQueue,
    Item,
    decode_queue,
    retry_after_s,
)

_MAX_TENANT_LEN = 128  # longer ids are hashed: memory per queued request stays bounded
_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_EWMA = 0.1  # weight of the newest request in the means (service time for Retry-After, stage times)
# The pipeline is sized for the mean; arrivals at decode vary around it, so a little more keeps decode
# from idling (measured: bench/flow_control.py --parts throughput); the surplus waits about one prefill
# leg (before issue 38 inside decode, first come first served; now in wait_for_decode, in class order).
# The surplus is the top class's alone: lower classes get the pipeline without it (with it for every
# class, interactive TTFT p90 under 2x load was 1.05x-8.4x unloaded in 3 runs, batch filling decode;
# with no margin, 1.01x-1.04x; measured before issue 38).
PIPELINE_MARGIN = 1.5
_ADMITTED = None  # a waiting request's future resolves to this, or to the reason it was shed
_current: contextvars.ContextVar[Optional["Admission"]] = contextvars.ContextVar("pdfleet_flow_admission",
                                                                                 default=None)


class Shed(Exception):
    """The gate refused the request: answer ``status`` (429) with Retry-After ``retry_after_s``."""

    def __init__(self, reason: str, retry_after_s: int, message: str, status: int = 429) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason  # discipline.SHED_REASONS
        self.retry_after_s = retry_after_s
        self.message = message


class Admission:
    """One admitted request's hold on the gate (from ``admit``)."""

    __slots__ = ("gate", "admitted_at", "ready_at", "decode_at", "released", "counted", "tenant", "klass", "cost",
                 "slot")

    def __init__(self, gate: Optional["FlowGate"], admitted_at: float, counted: bool, tenant: str = "",
                 klass: int = 0, cost: float = 1.0) -> None:
        self.gate = gate
        self.admitted_at = admitted_at
        self.ready_at: Optional[float] = None  # its legs before decode were over (it asked for decode)
        self.decode_at: Optional[float] = None
        self.released = False
        self.counted = counted  # False: let through without a slot (gate disabled or open)
        self.tenant, self.klass, self.cost = tenant, klass, cost  # its place in the decode wait
        self.slot = False  # holds one of decode's slots (counted in the gate's in_decode)

    def decode_started(self) -> None:
        """The request's decode leg started (idempotent: a retried decode leg is the same hold). Takes a
        decode slot if ``wait_for_decode`` did not (a front end that does not wait: counted, unbounded)."""
        if self.decode_at is None and self.counted and not self.released and self.gate is not None:
            self.gate._decode_started(self)


def decode_started() -> None:
    """The current request's decode leg started (the admission of this task, if any; else nothing).
    A front end calls this where its decode leg takes an endpoint."""
    admission = _current.get()
    if admission is not None:
        admission.decode_started()


class FlowMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.admitted = Counter("pdfleet_router_flow_admitted", "Requests the gate let through, by priority",
                                ["priority"], registry=r)
        self.shed = Counter("pdfleet_router_flow_shed", "Requests refused with 429, by priority and reason "
                            "(queue_full: on arrival; displaced: pushed out of the queue by a more important or "
                            "fairer arrival; queue_timeout: waited maxQueueSeconds)", ["priority", "reason"],
                            registry=r)
        self.abandoned = Counter("pdfleet_router_flow_abandoned", "Clients that left while queued, by priority",
                                 ["priority"], registry=r)
        self.queued = Gauge("pdfleet_router_flow_queued", "Requests waiting in the gate, by priority",
                            ["priority"], registry=r)
        self.wait = Histogram("pdfleet_router_flow_queue_wait_seconds", "Time from arrival to dispatch, by priority",
                              ["priority"], buckets=_WAIT_BUCKETS, registry=r)
        self.in_flight = Gauge("pdfleet_router_flow_in_flight", "Requests dispatched and not finished", registry=r)
        self.capacity = Gauge("pdfleet_router_flow_capacity", "Requests the gate lets run at once", registry=r)
        self.decode_waiting = Gauge("pdfleet_router_flow_decode_waiting", "Admitted requests waiting for a decode "
                                    "slot (their prefill leg over), by priority", ["priority"], registry=r)
        self.decode_wait = Histogram("pdfleet_router_flow_decode_wait_seconds", "Time from asking for a decode slot "
                                     "to having one, by priority", ["priority"], buckets=_WAIT_BUCKETS, registry=r)
        self.in_decode = Gauge("pdfleet_router_flow_in_decode", "Requests holding a decode slot (at most "
                               "maxInFlightPerDecode x ready decodes when the front end waits for one)", registry=r)


class FlowGate:
    def __init__(self, config: FlowControlConfig, registry: CollectorRegistry) -> None:
        self.config = config
        self.enabled = config.enabled
        classes = config.classes
        self.names = [c.name for c in classes]
        self._index = {c.name: i for i, c in enumerate(classes)}
        self.queue = FlowQueue([c.weight for c in classes], config.max_queued, config.max_queue_s)
        self.decode_queue = decode_queue([c.weight for c in classes], config.max_queue_s)
        self.by_cost = config.fairness == FAIRNESS_COST
        self.capacity = 0
        self.in_flight = 0  # admitted and not released
        self.in_decode = 0  # of those, holding a decode slot (granted by wait_for_decode, or decode_started)
        self.mean_service_s = 1.0
        self.mean_cost: Optional[float] = None
        self.mean_pre_decode_s: Optional[float] = None
        self.mean_decode_s: Optional[float] = None
        self._timer: Optional[asyncio.TimerHandle] = None
        self.metrics = FlowMetrics(registry) if self.enabled else None
        if self.metrics is not None:
            # Every series exists from the start (rates need a zero); the per-class children are looked
            # up once, not per request (labels() takes a lock and builds a key: measurable per request).
            m = self.metrics
            self._admitted = [m.admitted.labels(name) for name in self.names]
            self._queued = [m.queued.labels(name) for name in self.names]
            self._wait = [m.wait.labels(name) for name in self.names]
            self._decode_waiting = [m.decode_waiting.labels(name) for name in self.names]
            self._decode_wait = [m.decode_wait.labels(name) for name in self.names]
            for name in self.names:
                for reason in (QUEUE_FULL, DISPLACED, QUEUE_TIMEOUT):
                    m.shed.labels(name, reason)

    # ---- capacity ------------------------------------------------------------

    def set_ready_decodes(self, count: int) -> None:
        """The serving revision's ready decode endpoints changed."""
        self.capacity = count * self.config.max_in_flight_per_decode
        if self.metrics is not None:
            self._dispatch()

    def pipeline(self, margin: float = PIPELINE_MARGIN) -> int:
        """Requests let through beyond decode's capacity, to be in their prefill legs when decode frees
        slots: capacity x mean pre-decode time / mean decode time (x margin), at most capacity
        (0 until known)."""
        if self.mean_pre_decode_s is None or not self.mean_decode_s:
            return 0
        return min(self.capacity,
                   math.ceil(margin * self.capacity * self.mean_pre_decode_s / self.mean_decode_s))

    def effective_capacity(self) -> int:
        return self.capacity + self.pipeline() if self.capacity else 0

    def lower_capacity(self) -> int:
        """The bound below the top class: the pipeline without its margin (see PIPELINE_MARGIN)."""
        return self.capacity + self.pipeline(1.0) if self.capacity else 0

    # ---- the gate ------------------------------------------------------------

    def classify(self, headers: Mapping[str, str]) -> tuple[str, int]:
        """(tenant, class index): an unknown or missing priority is the lowest class."""
        tenant = headers.get(self.config.tenant_header, "")
        if len(tenant) > _MAX_TENANT_LEN:
            tenant = "sha256:" + hashlib.sha256(tenant.encode("utf-8", "surrogateescape")).hexdigest()
        klass = self._index.get(headers.get(self.config.priority_header, ""), len(self.names) - 1)
        return tenant, klass

    def _cost(self, cost: Optional[float]) -> float:
        if not self.by_cost:
            return 1.0
        if cost is None or not (cost > 0) or math.isinf(cost):
            return self.mean_cost or 1.0
        self.mean_cost = cost if self.mean_cost is None else self.mean_cost + _EWMA * (cost - self.mean_cost)
        return float(cost)

    @contextlib.asynccontextmanager
    async def admit(self, headers: Mapping[str, str], *, cost: Optional[float] = None) -> AsyncIterator[Admission]:
        """Hold a slot for the block's duration; raises Shed when the request is refused."""
        admission = await self._acquire(headers, cost)
        token = _current.set(admission)
        try:
            yield admission
        finally:
            _current.reset(token)
            self._release(admission)

    async def guard(self, headers: Mapping[str, str], handler: Callable[[], Awaitable[web.StreamResponse]], *,
                    cost: Optional[float] = None) -> web.StreamResponse:
        try:
            async with self.admit(headers, cost=cost):
                return await handler()
        except Shed as shed:
            return error_response(shed.status, shed.message, headers={"Retry-After": str(shed.retry_after_s)})

    async def _acquire(self, headers: Mapping[str, str], cost: Optional[float]) -> Admission:
        loop = asyncio.get_running_loop()
        if not self.enabled or self.capacity == 0:
            return Admission(None, loop.time(), counted=False)
        assert self.metrics is not None
        tenant, klass = self.classify(headers)
        item = Item(tenant, klass, loop.time(), loop.create_future(), cost=self._cost(cost))
        offer = self.queue.offer(item)
        if offer.refused:
            raise self._refusal(klass, QUEUE_FULL)
        if offer.displaced is not None:
            self._shed(offer.displaced, DISPLACED)
        self._set_queued(klass)
        self._dispatch()
        self._arm_timer()
        try:
            outcome = await item.token
        except asyncio.CancelledError:
            if self.queue.withdraw(item):
                self.metrics.abandoned.labels(self.names[klass]).inc()
                self._set_queued(klass)
            elif item.token.done() and not item.token.cancelled() and item.token.result() is _ADMITTED:
                self._release(Admission(self, loop.time(), counted=True))  # admitted just as its client left
            raise
        if outcome is not _ADMITTED:
            raise self._refusal(klass, outcome)
        return Admission(self, loop.time(), True, tenant, klass, item.cost)

    # ---- inside ----------------------------------------------------------------

    async def wait_for_decode(self, admission: Admission) -> None:
        """Until the admitted request may start its decode leg: decode holds fewer legs than its capacity
        and no request waiting for decode goes before it (discipline.py's order). A front end awaits it
        just before its decode leg picks a decode (after the prefill leg). At once when the request holds
        a decode slot already (a retried decode leg is the same hold), when the gate counted nothing
        (disabled, or open) or no ready decode is known. Raises ``Shed`` (queue_timeout, 429) after
        ``maxQueueSeconds`` of waiting; a client that leaves while it waits takes no slot."""
        if not admission.counted or admission.slot or admission.released or admission.gate is not self:
            return
        loop = asyncio.get_running_loop()
        self._ready_for_decode(admission, loop.time())
        if self.capacity == 0:
            return  # no ready decode known: open, as admission is (the pick answers for itself)
        assert self.metrics is not None
        future = loop.create_future()
        item = Item(admission.tenant, admission.klass, loop.time(), (future, admission), cost=admission.cost)
        self.decode_queue.offer(item)  # never refused (discipline.decode_queue)
        self._set_decode_waiting(item.klass)
        self._dispatch()
        self._arm_timer()
        try:
            outcome = await future
        except asyncio.CancelledError:
            if self.decode_queue.withdraw(item):
                self.metrics.abandoned.labels(self.names[item.klass]).inc()
                self._set_decode_waiting(item.klass)
            elif admission.slot and admission.decode_at is None:
                self._free_slot(admission)  # granted in the instant its client left: it keeps nothing
                self._dispatch()
            raise
        if outcome is not _ADMITTED:
            raise self._refusal(item.klass, outcome, "a decode slot after its prefill leg")

    def _ready_for_decode(self, admission: Admission, now: float) -> None:
        """The request's legs before decode are over: their time sizes the pipeline (the decode wait not in it,
        or the pipeline would grow with its own queue)."""
        if admission.ready_at is None:
            admission.ready_at = now
            pre = now - admission.admitted_at
            self.mean_pre_decode_s = pre if self.mean_pre_decode_s is None else \
                self.mean_pre_decode_s + _EWMA * (pre - self.mean_pre_decode_s)

    def _decode_started(self, admission: Admission) -> None:
        now = asyncio.get_running_loop().time()
        admission.decode_at = now
        self._ready_for_decode(admission, now)
        if not admission.slot:
            admission.slot = True
            self.in_decode += 1

    def _free_slot(self, admission: Admission) -> None:
        admission.slot = False
        self.in_decode -= 1

    def _release(self, admission: Admission) -> None:
        if admission.released or not admission.counted:
            return
        admission.released = True
        now = asyncio.get_running_loop().time()
        if admission.slot:
            self._free_slot(admission)
        if admission.decode_at is not None:
            d = now - admission.decode_at
            self.mean_decode_s = d if self.mean_decode_s is None else self.mean_decode_s + _EWMA * (d - self.mean_decode_s)
        self.in_flight -= 1
        self.mean_service_s += _EWMA * ((now - admission.admitted_at) - self.mean_service_s)
        self._dispatch()

    def _dispatch(self) -> None:
        assert self.metrics is not None
        now = asyncio.get_running_loop().time() if self.queue.size or self.decode_queue.size else 0.0
        self._dispatch_decode(now)  # first: a slot decode frees goes to a request whose prefill is over
        capacity = self.effective_capacity()
        touched = set()
        for item in self.queue.dispatch(self.in_flight, capacity, self.lower_capacity()):
            touched.add(item.klass)
            if item.token.done():  # its task was cancelled a moment ago; it withdraws nothing
                continue
            self.in_flight += 1
            self._admitted[item.klass].inc()
            self._wait[item.klass].observe(now - item.arrived)
            item.token.set_result(_ADMITTED)
        for klass in touched:
            self._set_queued(klass)
        self.metrics.in_flight.set(self.in_flight)
        self.metrics.capacity.set(capacity)

    def _dispatch_decode(self, now: float) -> None:
        """Decode slots to the requests waiting for one, in the discipline's order, while decode has room."""
        assert self.metrics is not None
        touched = set()
        for item in self.decode_queue.dispatch(self.in_decode, self.capacity, spare=0):
            touched.add(item.klass)
            future, admission = item.token
            if future.done():  # its task was cancelled a moment ago; it withdraws nothing
                continue
            admission.slot = True
            self.in_decode += 1
            self._decode_wait[item.klass].observe(now - item.arrived)
            future.set_result(_ADMITTED)
        for klass in touched:
            self._set_decode_waiting(klass)
        self.metrics.in_decode.set(self.in_decode)

    def _shed(self, item: Item, reason: str) -> None:
        """A queued request is refused: its waiting task raises Shed."""
        self._set_queued(item.klass)
        if not item.token.done():
            item.token.set_result(reason)

    def _refusal(self, klass: int, reason: str, waited_for: str = "a free slot") -> Shed:
        assert self.metrics is not None
        name = self.names[klass]
        self.metrics.shed.labels(name, reason).inc()
        self._set_queued(klass)
        after = retry_after_s(self.queue.size, self.capacity, self.mean_service_s, self.config.max_queue_s)
        why = {QUEUE_FULL: f"its queue holds {self.config.max_queued} requests",
               DISPLACED: "a more important request took its place in the queue",
               QUEUE_TIMEOUT: f"it waited {self.config.max_queue_s:g} s without {waited_for}"}[reason]
        return Shed(reason, after, f"the router is overloaded: request (priority {name!r}) shed, {why}; "
                                   f"retry after {after} s")

    def _set_queued(self, klass: int) -> None:
        assert self.metrics is not None
        self._queued[klass].set(self.queue.queued(klass))

    def _set_decode_waiting(self, klass: int) -> None:
        self._decode_waiting[klass].set(self.decode_queue.queued(klass))

    def _arm_timer(self) -> None:
        """One timer, at the oldest waiting request's deadline (of either wait)."""
        due = min((d for d in (self.queue.next_expiry(), self.decode_queue.next_expiry()) if d is not None),
                  default=None)
        self._timer = deadline.arm(self._timer, due, self._expire)

    def _expire(self) -> None:
        self._timer = None
        now = asyncio.get_running_loop().time()
        for item in self.queue.expire(now):
            self._shed(item, QUEUE_TIMEOUT)
        for item in self.decode_queue.expire(now):
            self._set_decode_waiting(item.klass)
            if not item.token[0].done():
                item.token[0].set_result(QUEUE_TIMEOUT)
        self._arm_timer()
