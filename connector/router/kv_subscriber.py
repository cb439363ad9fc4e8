"""One engine's KV event stream, read over ZMQ into its BlockIndex (the I/O edge).

A SUB socket receives vLLM's batches; a DEALER socket asks the engine's replay
ROUTER for batches the router missed: at start (to learn what the engine
cached before the router subscribed, and as a sign the stream is reachable)
and after a sequence gap. A gap the replay cannot fill, or a publisher that
starts over, resets the index: the router then knows less, never something
false. Every message is checked by kv_events.decode_message (msgspec, bounded
sizes); a bad one is dropped and counted, and changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import zmq
import zmq.asyncio

from pdfleet.connector.router import kv_events as ke

log = logging.getLogger("pdfleet.router.kv_events")

# ZMQ's own hard cap (the connection is dropped beyond it); decode_message's is the soft one.
_ZMQ_MAX_MSG = 64 * 1024 * 1024
_RCVHWM = 10_000
REPLAY_TIMEOUT_S = 2.0
_MAX_REPLAYED = 20_000  # batches taken from one replay (vLLM buffers 10,000 by default)
RETRY_S = 2.0


@dataclass(frozen=True)
class EventSource:
    """Where one engine publishes: its PUB endpoint and, optionally, its replay endpoint."""

    url: str  # the engine's HTTP base URL (the router's name for it)
    endpoint: str  # e.g. tcp://10.0.0.7:5557 or ipc:///run/prefill-0.kv-events
    replay: str | None = None


@dataclass
class EndpointState:
    """The router's knowledge of one engine's cache and of its stream."""

    source: EventSource
    index: ke.BlockIndex
    tracker: ke.StreamTracker = field(default_factory=ke.StreamTracker)
    synced: bool = False  # the index reflects the stream (replay answered, or a batch arrived)
    received: int = 0
    last_event_at: float = 0.0


class Counters:
    """Callbacks into the router's metrics (kept abstract so tests can count too)."""

    def received(self, url: str) -> None: ...
    def dropped(self, url: str, reason: str) -> None: ...
    def reset(self, url: str, reason: str) -> None: ...
    def index_size(self, url: str, size: int) -> None: ...


def handle_message(state: EndpointState, frames: list[bytes], counters: Counters, *,
                   max_bytes: int, replay: Callable[[int, int], list[ke.Message] | None]) -> None:
    """Apply one live message. ``replay(start, stop)``: the decoded batches [start, stop) or None."""
    url = state.source.url
    msg = ke.decode_message(frames, max_bytes=max_bytes)
    if isinstance(msg, str):
        counters.dropped(url, msg)
        return
    if msg.unknown_events:
        counters.dropped(url, "unknown_event")
    verdict = state.tracker.classify(msg.seq)
    if verdict == ke.DUPLICATE:
        return
    if verdict == ke.RESTART:
        state.index.clear()
        state.tracker.reset()
        counters.reset(url, "restart")
    elif verdict == ke.GAP:
        expected = state.tracker.expected
        got = replay(expected, msg.seq) if state.source.replay else None
        first = got[0].seq if got else None
        if got is not None and ke.replay_covers(expected, first, msg.seq):
            for m in got:
                if expected <= m.seq < msg.seq:
                    _apply(state, m, counters)
        else:
            state.index.clear()
            counters.reset(url, "gap" if state.tracker.last is not None else "joined_late")
            for m in got or ():
                if m.seq < msg.seq:
                    _apply(state, m, counters)
    _apply(state, msg, counters)
    state.synced = True


def _apply(state: EndpointState, msg: ke.Message, counters: Counters) -> None:
    url = state.source.url
    if not state.index.apply(msg.events):
        counters.reset(url, "index_full")
    state.tracker.applied(msg.seq)
    state.received += 1
    state.last_event_at = time.monotonic()
    counters.received(url)
    counters.index_size(url, len(state.index))


class Subscriber:
    """The task that keeps one EndpointState current until cancelled."""

    def __init__(self, state: EndpointState, counters: Counters, ctx: zmq.asyncio.Context, *,
                 max_bytes: int = ke.MAX_MESSAGE_BYTES) -> None:
        self.state = state
        self.counters = counters
        self.ctx = ctx
        self.max_bytes = max_bytes

    async def run(self) -> None:
        sub = self.ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.LINGER, 0)
        sub.setsockopt(zmq.RCVHWM, _RCVHWM)
        sub.setsockopt(zmq.MAXMSGSIZE, _ZMQ_MAX_MSG)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.connect(self.state.source.endpoint)
        try:
            await self._initial_replay()
            while True:
                if not self.state.synced and self.state.source.replay:
                    # Until the stream is known to be reachable, ask again now and then.
                    try:
                        frames = await asyncio.wait_for(sub.recv_multipart(copy=True), RETRY_S)
                    except asyncio.TimeoutError:
                        await self._initial_replay()
                        continue
                else:
                    frames = await sub.recv_multipart(copy=True)
                await self._handle(frames)
        finally:
            sub.close(linger=0)

    async def _handle(self, frames: list[bytes]) -> None:
        pending: dict[tuple[int, int], list[ke.Message] | None] = {}
        msg = ke.decode_message(frames, max_bytes=self.max_bytes)
        if not isinstance(msg, str):
            verdict = ke.StreamTracker(self.state.tracker.last, self.state.tracker.replayed_upto).classify(msg.seq)
            if verdict == ke.GAP and self.state.source.replay:
                start = self.state.tracker.expected
                pending[(start, msg.seq)] = await self._replay(start, msg.seq)
        try:
            handle_message(self.state, frames, self.counters, max_bytes=self.max_bytes,
                           replay=lambda a, b: pending.get((a, b)))
        except Exception:  # never let one message end the subscription
            log.exception("KV events from %s: message not applied", self.state.source.url)
            self.counters.dropped(self.state.source.url, "error")

    async def _initial_replay(self) -> None:
        got = await self._replay(0, None)
        if got is None:
            return
        for m in got:
            if self.state.tracker.classify(m.seq) in (ke.NEXT, ke.GAP):
                _apply(self.state, m, self.counters)
        if got:
            self.state.tracker.replayed(got[-1].seq)
        self.state.synced = True
        log.info("KV events of %s: synced (%d batches replayed)", self.state.source.url, len(got))

    async def _replay(self, start: int, stop: int | None) -> list[ke.Message] | None:
        """Batches [start, stop) from the replay endpoint, or None when it does not answer."""
        if not self.state.source.replay:
            return None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.MAXMSGSIZE, _ZMQ_MAX_MSG)
        dealer.connect(self.state.source.replay)
        out: list[ke.Message] = []
        try:
            async with asyncio.timeout(REPLAY_TIMEOUT_S):  # an engine that is down must not stall the stream
                await dealer.send_multipart(ke.encode_replay_request(start))
                while True:
                    frames = await dealer.recv_multipart(copy=True)
                    if ke.is_replay_end(frames):
                        return out
                    msg = ke.decode_message(frames[1:], max_bytes=self.max_bytes)  # drop the delimiter
                    if isinstance(msg, str):
                        self.counters.dropped(self.state.source.url, msg)
                        continue
                    if stop is not None and msg.seq >= stop:
                        continue
                    out.append(msg)
                    if len(out) > _MAX_REPLAYED:
                        return None  # more than the router keeps: treat as unanswered (the index resets)
        except TimeoutError:
            return None
        finally:
            dealer.close(linger=0)
