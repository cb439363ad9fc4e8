"""The flow-control gate: the asyncio edge of discipline.py, in front of the router's legs.

``FlowGate.guard(headers, handler)`` runs the handler once the queue discipline dispatches the
request, or answers 429 with Retry-After (OpenAI's error shape) when it is shed. Disabled, it
runs the handler at once and counts nothing: the router as before.

Capacity: requests in flight through the gate (from dispatch until the handler returned, i.e.
both legs and the whole relayed answer: what the router's Outstanding tracks per decode) may
be at most ``maxInFlightPerDecode`` x the ready decode endpoints of the serving revision (every
request holds exactly one decode until its last byte; least-outstanding keeps them even). With
no serving revision the gate stays open, so the router answers its own 503 at once.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Mapping
from typing import Optional

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pdfleet.connector.router.errors import error_response
from pdfleet.contract.flow_control import FlowControlConfig
from pdfleet.connector.router.flow.discipline import (
    DISPLACED,
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    FlowQueue,
    Item,
    retry_after_s,
)

_MAX_TENANT_LEN = 128  # longer ids are hashed: memory per queued request stays bounded
_WAIT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_SERVICE_EWMA = 0.1  # weight of the newest request in the mean service time (for Retry-After)
_ADMITTED = None  # a waiting request's future resolves to this, or to the reason it was shed


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


class FlowGate:
    def __init__(self, config: FlowControlConfig, registry: CollectorRegistry) -> None:
        self.config = config
        self.enabled = config.enabled
        classes = config.classes
        self.names = [c.name for c in classes]
        self._index = {c.name: i for i, c in enumerate(classes)}
        self.queue = FlowQueue([c.weight for c in classes], config.max_queued, config.max_queue_s)
        self.capacity = 0
        self.in_flight = 0
        self.mean_service_s = 1.0
        self._timer: Optional[asyncio.TimerHandle] = None
        self.metrics = FlowMetrics(registry) if self.enabled else None
        if self.metrics is not None:
            for name in self.names:  # every series exists from the start (rates need a zero)
                self.metrics.admitted.labels(name)
                self.metrics.queued.labels(name)
                for reason in (QUEUE_FULL, DISPLACED, QUEUE_TIMEOUT):
                    self.metrics.shed.labels(name, reason)

    # ---- capacity ------------------------------------------------------------

    def set_ready_decodes(self, count: int) -> None:
        """The serving revision's ready decode endpoints changed."""
        self.capacity = count * self.config.max_in_flight_per_decode
        if self.metrics is not None:
            self.metrics.capacity.set(self.capacity)
            self._dispatch()

    # ---- the gate ------------------------------------------------------------

    def classify(self, headers: Mapping[str, str]) -> tuple[str, int]:
        """(tenant, class index): an unknown or missing priority is the lowest class."""
        tenant = headers.get(self.config.tenant_header, "")
        if len(tenant) > _MAX_TENANT_LEN:
            tenant = "sha256:" + hashlib.sha256(tenant.encode("utf-8", "surrogateescape")).hexdigest()
        klass = self._index.get(headers.get(self.config.priority_header, ""), len(self.names) - 1)
        return tenant, klass

    async def guard(self, headers: Mapping[str, str],
                    handler: Callable[[], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if not self.enabled or self.capacity == 0:
            return await handler()
        assert self.metrics is not None
        loop = asyncio.get_running_loop()
        tenant, klass = self.classify(headers)
        item = Item(tenant, klass, loop.time(), loop.create_future())
        offer = self.queue.offer(item)
        if offer.refused:
            return self._refusal(klass, QUEUE_FULL)
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
                self._finished(loop.time(), loop.time())  # admitted just as its client left
            raise
        if outcome is not _ADMITTED:
            return self._refusal(klass, outcome)
        started = loop.time()
        try:
            return await handler()
        finally:
            self._finished(started, loop.time())

    # ---- inside ----------------------------------------------------------------

    def _dispatch(self) -> None:
        assert self.metrics is not None
        now = asyncio.get_running_loop().time() if self.queue.size else 0.0
        touched = set()
        for item in self.queue.dispatch(self.in_flight, self.capacity):
            touched.add(item.klass)
            if item.token.done():  # its task was cancelled a moment ago; it withdraws nothing
                continue
            self.in_flight += 1
            name = self.names[item.klass]
            self.metrics.admitted.labels(name).inc()
            self.metrics.wait.labels(name).observe(now - item.arrived)
            item.token.set_result(_ADMITTED)
        for klass in touched:
            self._set_queued(klass)
        self.metrics.in_flight.set(self.in_flight)

    def _finished(self, started: float, ended: float) -> None:
        self.in_flight -= 1
        self.mean_service_s += _SERVICE_EWMA * ((ended - started) - self.mean_service_s)
        self._dispatch()

    def _shed(self, item: Item, reason: str) -> None:
        """A queued request is refused: its waiting handler answers 429."""
        self._set_queued(item.klass)
        if not item.token.done():
            item.token.set_result(reason)

    def _refusal(self, klass: int, reason: str) -> web.Response:
        assert self.metrics is not None
        name = self.names[klass]
        self.metrics.shed.labels(name, reason).inc()
        self._set_queued(klass)
        after = retry_after_s(self.queue.size, self.capacity, self.mean_service_s, self.config.max_queue_s)
        why = {QUEUE_FULL: f"its queue holds {self.config.max_queued} requests",
               DISPLACED: "a more important request took its place in the queue",
               QUEUE_TIMEOUT: f"it waited {self.config.max_queue_s:g} s without a free slot"}[reason]
        return error_response(429, f"the router is overloaded: request (priority {name!r}) shed, {why}; "
                                   f"retry after {after} s", headers={"Retry-After": str(after)})

    def _set_queued(self, klass: int) -> None:
        assert self.metrics is not None
        self.metrics.queued.labels(self.names[klass]).set(self.queue.queued(klass))

    def _arm_timer(self) -> None:
        """One timer, at the oldest waiting request's deadline."""
        due = self.queue.next_expiry()
        if due is None or (self._timer is not None and self._timer.when() <= due):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = asyncio.get_running_loop().call_at(due, self._expire)

    def _expire(self) -> None:
        self._timer = None
        for item in self.queue.expire(asyncio.get_running_loop().time()):
            self._shed(item, QUEUE_TIMEOUT)
        self._arm_timer()
