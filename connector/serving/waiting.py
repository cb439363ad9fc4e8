"""The waiting room's asyncio edge (issue 41): requests held at the front door while no pair is ready.

The pipeline's ``admit`` step awaits ``hold`` before the flow gate; the picker calls ``set_endpoints``
on every discovery change. What to do is waiting_room.py's (pure); here are the waits, their order and
the metrics:

- held requests wait in flow control's queue discipline (flow/discipline.py: classes by weight, tenants
  in turn, FIFO within a tenant; one class and arrival order when flow control is off) and are released
  all at once, in that order, when a pair is ready: they then enter the flow gate in that order;
- each wait is bounded by ``timeout_s`` (one timer at the oldest's deadline), then answered by
  ``waiting_room.expired``; a client that leaves frees its place and its bytes;
- the first held request of a cold episode counts an activation and calls ``activator`` (an optional
  callback the embedder sets, e.g. ``pdfleet local``). In a cluster the front end writes nothing: the
  operator reads ``pdfleet_router_waiting_requests`` and the activations counter from /metrics and wakes
  both roles (contract/scale_to_zero.py).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pdfleet.connector.serving import waiting_room
from pdfleet.connector.serving.flow import deadline
from pdfleet.connector.serving.flow.discipline import FlowQueue, Item
from pdfleet.connector.serving.flow.gate import FlowGate
from pdfleet.contract import scale_to_zero as stz
from pdfleet.contract.router_config import RouterConfig

log = logging.getLogger("pdfleet.router")

_RELEASED = None  # a held request's future resolves to this, or to the Drop that answers it
_ACTIVATION_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600)


class Dropped(Exception):
    """The waiting room gave up on the request: answer ``drop`` (pipeline.py words it)."""

    def __init__(self, drop: waiting_room.Drop) -> None:
        super().__init__(drop.reason)
        self.drop = drop


class WaitingMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.waiting = Gauge(stz.ROUTER_WAITING_REQUESTS, "Requests held while no prefill/decode pair is ready",
                             registry=r)
        self.activations = Counter(stz.ROUTER_ACTIVATIONS, "Cold episodes: a request held while no pair was "
                                   "ready and none was held (an activation asked for)", registry=r)
        self.activation_wait = Histogram(stz.ROUTER_ACTIVATION_WAIT, "From a cold episode's first held request "
                                         "to the first ready pair", buckets=_ACTIVATION_BUCKETS, registry=r)
        self.dropped = Counter(stz.ROUTER_WAITING_DROPPED, "Requests the waiting room answered without a pair, "
                               "by reason", [stz.DROPPED_REASON], registry=r)
        for reason in stz.DROPPED_REASONS:
            self.dropped.labels(reason)


class WaitingRoom:
    def __init__(self, config: RouterConfig, registry: CollectorRegistry, flow: FlowGate) -> None:
        self.bounds = waiting_room.Bounds(config.scale_to_zero_max_waiting, config.scale_to_zero_max_waiting_bytes,
                                          config.scale_to_zero_activation_timeout_s)
        self._flow = flow  # its classes order the room when flow control is on
        weights = [c.weight for c in config.flow_control.classes] if flow.enabled else [1]
        self.queue = FlowQueue(weights, sys.maxsize, self.bounds.timeout_s)  # bounded by arrival(), not here
        self.metrics = WaitingMetrics(registry)
        self.activator: Callable[[], Any] | None = None
        self.pair_ready = False
        self.endpoints_up = False
        self.held_bytes = 0
        self._cold_since: float | None = None  # the episode's first held request (loop clock)
        self._timer: asyncio.TimerHandle | None = None

    # ---- discovery ------------------------------------------------------------

    def set_endpoints(self, *, pair_ready: bool, endpoints_up: bool) -> None:
        """The endpoints changed: with a pair ready, every held request goes on, in the discipline's order."""
        self.pair_ready, self.endpoints_up = pair_ready, endpoints_up
        if not pair_ready:
            return
        if self._cold_since is not None:
            self.metrics.activation_wait.observe(asyncio.get_running_loop().time() - self._cold_since)
            self._cold_since = None
        if self.queue.size:
            for item in self.queue.dispatch(0, self.queue.size, spare=0):
                self._left(item)
                if not item.token[0].done():
                    item.token[0].set_result(_RELEASED)

    def health(self) -> tuple[int, str]:
        """The front end's /health status and word (waiting_room.health)."""
        return waiting_room.health(self.bounds, pair_ready=self.pair_ready)

    # ---- a request --------------------------------------------------------------

    async def hold(self, headers: Mapping[str, str], size: int) -> None:
        """Returns when the request may go on (at once unless no pair is ready and the room is on);
        raises ``Dropped`` when the room is full or the wait ran out."""
        verdict = waiting_room.arrival(self.bounds, pair_ready=self.pair_ready, held=self.queue.size,
                                       held_bytes=self.held_bytes, size=size)
        if verdict == waiting_room.PASS:
            return
        if verdict == waiting_room.FULL:
            self._drop(waiting_room.room_full())
        loop = asyncio.get_running_loop()
        tenant, klass = self._flow.classify(headers) if self._flow.enabled else ("", 0)
        item = Item(tenant, klass, loop.time(), (loop.create_future(), size))
        self.queue.offer(item)  # never refused: arrival() bounds the room
        self.held_bytes += size
        self.metrics.waiting.set(self.queue.size)
        if self._cold_since is None:
            self._activate(loop.time())
        self._arm_timer()
        try:
            outcome = await item.token[0]
        except asyncio.CancelledError:
            if self.queue.withdraw(item):  # the client left: its place and bytes are free
                self._left(item)
            raise
        if outcome is not _RELEASED:
            self._drop(outcome)

    def _activate(self, now: float) -> None:
        self._cold_since = now
        self.metrics.activations.inc()
        if self.activator is not None:
            try:
                self.activator()
            except Exception:  # the activator's failure must not fail the request: the operator also sees the gauge
                log.exception("the waiting room's activator failed")

    def _left(self, item: Item) -> None:
        self.held_bytes -= item.token[1]
        self.metrics.waiting.set(self.queue.size)
        if not self.queue.size and not self.pair_ready:
            self._cold_since = None  # the room emptied while cold: the next held request asks again

    def _drop(self, drop: waiting_room.Drop) -> None:
        self.metrics.dropped.labels(drop.reason).inc()
        raise Dropped(drop)

    # ---- expiry -------------------------------------------------------------------

    def _arm_timer(self) -> None:
        self._timer = deadline.arm(self._timer, self.queue.next_expiry(), self._expire)

    def _expire(self) -> None:
        self._timer = None
        drop = waiting_room.expired(endpoints_up=self.endpoints_up)
        for item in self.queue.expire(asyncio.get_running_loop().time()):
            self._left(item)
            if not item.token[0].done():
                item.token[0].set_result(drop)
        self._arm_timer()
