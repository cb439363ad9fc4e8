"""One engine's KV event stream, read over ZMQ into its BlockIndex (the I/O edge).

A SUB connection receives vLLM's batches; a DEALER connection asks the engine's replay
ROUTER for batches the router missed: at start (to learn what the engine
cached before the router subscribed, and as a sign the stream is reachable)
and after a sequence gap. A gap the replay cannot fill, or a publisher that
starts over, resets the index: the router then knows less, never something
false. Every message is checked by kv_events.decode_message (msgspec, bounded
sizes); a bad one is dropped and counted, and changes nothing.

Both connections speak ZMTP through zmtp.py rather than libzmq sockets, so that a *message* is
bounded, not only each frame: a multipart message that never ends is refused at its bound, and
its connection dropped (libzmq buffers such a message without limit). Each batch is decoded
once, and its decoded size is bounded too (kv_events.decode_message's ``max_decoded_bytes``).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from pdfleet.connector.serving.kvaware import kv_events as ke
from pdfleet.connector.serving.kvaware import zmtp
from pdfleet.contract.kv_tiers import MEDIUMS

log = logging.getLogger("pdfleet.router.kv_events")

# A connection is dropped when a message's frames add up past max_bytes + this (decode_message counts
# those between max_bytes and it as "oversized"); the slack is for the topic and sequence frames.
_FRAME_SLACK = 64 * 1024
_LIVE_FRAMES, _REPLAY_FRAMES = 3, 4  # [topic, seq, payload]; a replayed batch has a delimiter first
# Bytes of batches planned per connection (a publisher has two: live SUB, replay DEALER); the depth in
# messages follows from the message cap (see Budget for what the router holds of it).
LIVE_QUEUE_BYTES = 64 * 1024 * 1024
_MIN_RCVHWM, _MAX_RCVHWM = 4, 10_000
MIN_MESSAGE_BYTES = 64 * 1024  # the cap a tight budget may shrink a publisher's messages to
# A block hash in a tier of an endpoint's index (an OrderedDict of int -> count, kv_events.Tier): 117 to 152
# bytes measured, 152 right after the dict grew (a set of ints, before tiers and counts: 64).
INDEX_BYTES_PER_BLOCK = 152
REPLAY_TIMEOUT_S = 2.0
_MAX_REPLAYED = 20_000  # batches taken from one replay (vLLM buffers 10,000 by default)
RETRY_S = 2.0
RESTART_BASE_S, RESTART_MAX_S = 0.5, 30.0


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
    def evicted(self, url: str, medium: str, blocks: int) -> None: ...


def decoded_allowance(max_bytes: int, depth: int) -> int:
    """Bytes a publisher's decoded batch may take: its queue budget (``Budget.queue_bytes``) less the two
    wire messages it holds while reading (one per connection)."""
    return 2 * max(1, depth) * (max_bytes + _FRAME_SLACK)


def safe_decode(frames: list[bytes], *, max_bytes: int, max_decoded_bytes: int | None = None) -> ke.Message | str:
    """decode_message, with anything it raises (a deeply nested batch: RecursionError) as "malformed"."""
    try:
        return ke.decode_message(frames, max_bytes=max_bytes, max_decoded_bytes=max_decoded_bytes)
    except Exception:  # noqa: BLE001 - a peer's bytes must never end the subscription
        return "malformed"


def handle_message(state: EndpointState, message: list[bytes] | ke.Message, counters: Counters, *,
                   max_bytes: int, replay: Callable[[int, int], list[ke.Message] | None]) -> None:
    """Apply one live message (its frames, or the batch already decoded from them: a batch is decoded
    once). ``replay(start, stop)``: the decoded batches [start, stop) or None."""
    url = state.source.url
    msg = safe_decode(message, max_bytes=max_bytes) if isinstance(message, list) else message
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
    for medium, blocks in state.index.apply(msg.events).items():
        counters.evicted(url, medium, blocks)  # a tier past its bound lost its least recently stored blocks
    state.tracker.applied(msg.seq)
    state.received += 1
    state.last_event_at = time.monotonic()
    counters.received(url)
    counters.index_size(url, len(state.index))


def live_queue_depth(max_bytes: int, queue_bytes: int = LIVE_QUEUE_BYTES) -> int:
    """ZMQ counts its receive queue in messages: as many as ``queue_bytes`` of the largest allowed."""
    return max(_MIN_RCVHWM, min(_MAX_RCVHWM, queue_bytes // max(1, max_bytes)))


@dataclass(frozen=True)
class Budget:
    """What one publisher may hold: ``queue_bytes`` for its batches, i.e. the message being read on each
    of its two connections (at most ``max_bytes``) and one decoded batch (``decoded_allowance``: the
    rest, room for ``depth`` messages a connection), and ``index_blocks`` block hashes in each tier of its
    index."""

    depth: int
    max_bytes: int
    index_blocks: int

    @property
    def queue_bytes(self) -> int:
        return 2 * (self.depth + 1) * (self.max_bytes + _FRAME_SLACK)


def plan_budget(publishers: int, *, total_bytes: int, max_bytes: int, index_max_blocks: int,
                socket_bytes: int = LIVE_QUEUE_BYTES, tiers: int = len(MEDIUMS)) -> Budget:
    """Each publisher's share of the router's KV-event memory (pure).

    ``total_bytes`` bounds the router's KV-event memory across all publishers: half for ZMQ's
    queues, half for the block indexes. A publisher's queues get at most ``socket_bytes`` a
    socket, less when there are more publishers than half the total allows: the depth goes
    down to 1, and the message cap (bigger batches are dropped as oversized, counted) down to
    MIN_MESSAGE_BYTES. Each of its index's ``tiers`` (media) gets at most ``index_max_blocks``
    blocks, less when the other half divided among the publishers' tiers is smaller. Below MIN_MESSAGE_BYTES a publisher the bound
    cannot hold (more than total / 0.5 MiB publishers); it then takes the smallest queues.
    """
    n = max(1, publishers)
    per_socket = min(socket_bytes, total_bytes // (4 * n))
    depth, cap = 1, MIN_MESSAGE_BYTES
    for d in range(min(_MAX_RCVHWM, max(_MIN_RCVHWM, per_socket // (max_bytes + _FRAME_SLACK) - 1)), 0, -1):
        c = min(max_bytes, per_socket // (d + 1) - _FRAME_SLACK)
        if c >= min(max_bytes, MIN_MESSAGE_BYTES):
            depth, cap = d, c
            break
    blocks = max(1, min(index_max_blocks, total_bytes // (2 * n * max(1, tiers) * INDEX_BYTES_PER_BLOCK)))
    return Budget(depth, cap, blocks)


def restart_delay(failures: int) -> float:
    """Backoff before a subscriber that failed ``failures`` times in a row runs again."""
    return min(RESTART_MAX_S, RESTART_BASE_S * 2 ** max(0, failures - 1))


class _ReplayFailed(Exception):
    """The replay endpoint did not answer in time, or sent more than the router takes."""


class Subscriber:
    """The task that keeps one EndpointState current until cancelled.

    Memory: each of its two ZMQ sockets queues at most ``depth`` messages of ``max_bytes``
    (``plan_budget``: a publisher's share of the router's total), replayed batches are
    applied one by one as they arrive (never held as a list), and the index is bounded by
    its share of blocks. A subscriber that fails for any reason is restarted
    (``run_forever``) with its index cleared and marked unsynced until a replay or a
    batch brings it back.
    """

    def __init__(self, state: EndpointState, counters: Counters, ctx: object = None, *,
                 max_bytes: int = ke.MAX_MESSAGE_BYTES, depth: int | None = None, resume: bool = False) -> None:
        self.state = state
        self.counters = counters
        self.ctx = ctx  # unused since the connections speak ZMTP themselves (kept for callers that pass one)
        self.max_bytes = max_bytes
        self.depth = live_queue_depth(max_bytes) if depth is None else depth
        self.max_decoded_bytes = decoded_allowance(max_bytes, self.depth)
        # resume: the state is kept from a subscriber this one replaces (a smaller budget); a synced
        # state needs no initial replay, a gap in between is filled like any other
        self.resume = resume
        self.restarts = 0

    async def run_forever(self) -> None:
        failures = 0
        while True:
            started = time.monotonic()
            try:
                await self.run()
                return
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001
                url = self.state.source.url
                failures = 1 if time.monotonic() - started > RESTART_MAX_S else failures + 1
                self.restarts += 1
                log.exception("KV events of %s: subscriber failed; restarting, unsynced until replayed", url)
                self.state.synced = False
                self.state.index.clear()
                self.state.tracker.reset()
                self.counters.reset(url, "subscriber_restart")
                self.counters.index_size(url, 0)
                await asyncio.sleep(restart_delay(failures))

    async def _connect_live(self) -> zmtp.Connection:
        """The live connection; an engine not listening yet is retried every RETRY_S (as a libzmq
        SUB would, quietly), with the initial replay tried meanwhile."""
        while True:
            try:
                return await zmtp.Connection.open(self.state.source.endpoint, zmtp.SUB)
            except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError) as exc:
                log.debug("KV events of %s: cannot connect yet: %r", self.state.source.url, exc)
            await asyncio.sleep(RETRY_S)

    async def _recv(self, conn: zmtp.Connection, max_frames: int) -> list[bytes]:
        try:
            return await conn.recv_multipart(max_bytes=self.max_bytes + _FRAME_SLACK, max_frames=max_frames)
        except zmtp.MessageTooLarge as exc:
            self.counters.dropped(self.state.source.url, exc.reason)
            raise

    async def _next_live(self, conn: list[zmtp.Connection]) -> list[bytes]:
        if not conn:
            conn.append(await self._connect_live())
        return await self._recv(conn[0], _LIVE_FRAMES)

    async def run(self) -> None:
        conn: list[zmtp.Connection] = []  # the live connection, once made
        # connecting (and reading) goes on beside the initial replay, as a libzmq SUB's would
        pending: asyncio.Future[list[bytes]] | None = asyncio.ensure_future(self._next_live(conn))
        try:
            if not (self.resume and self.state.synced):
                await self._initial_replay()
            self.resume = False  # a restart after a failure starts over
            while True:
                if pending is None:
                    pending = asyncio.ensure_future(self._next_live(conn))
                if not self.state.synced and self.state.source.replay:
                    # Until the stream is known to be reachable, ask again now and then (the read goes
                    # on meanwhile: a message is never cut halfway).
                    done, _ = await asyncio.wait({pending}, timeout=RETRY_S)
                    if not done:
                        await self._initial_replay()
                        continue
                frames = await pending
                pending = None
                await self._handle(frames)
        finally:
            if pending is not None:
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)
            for c in conn:
                c.close()

    async def _handle(self, frames: list[bytes]) -> None:
        url = self.state.source.url
        msg = safe_decode(frames, max_bytes=self.max_bytes, max_decoded_bytes=self.max_decoded_bytes)
        if isinstance(msg, str):
            self.counters.dropped(url, msg)
            return
        try:
            verdict = ke.StreamTracker(self.state.tracker.last, self.state.tracker.replayed_upto).classify(msg.seq)
            if verdict == ke.GAP and self.state.source.replay:
                await self._fill_gap(self.state.tracker.expected, msg.seq)
            handle_message(self.state, msg, self.counters, max_bytes=self.max_bytes, replay=lambda a, b: None)
        except Exception:  # never let one message end the subscription
            log.exception("KV events from %s: message not applied", url)
            self.counters.dropped(url, "error")

    async def _fill_gap(self, start: int, stop: int) -> None:
        """Apply the replayed batches [start, stop) as they arrive. When the replay does not
        reach back to ``start`` (or fails), the index is reset and holds only what follows."""
        reason = "gap" if self.state.tracker.last is not None else "joined_late"
        covered: bool | None = None
        try:
            async for m in self._replay(start, stop):
                if covered is None:
                    covered = ke.replay_covers(start, m.seq, stop)
                    if not covered:
                        self._reset(reason)
                if not covered or m.seq >= start:
                    _apply(self.state, m, self.counters)
        except _ReplayFailed:  # a hole left somewhere: what was applied may lack removals
            if covered is not False:
                self._reset(reason)
            covered = False
        if covered is None:  # the replay had nothing for the hole
            self._reset(reason)
        if self.state.tracker.expected != stop:
            self.state.tracker.last = stop - 1  # the index holds nothing from before the live batch

    def _reset(self, reason: str) -> None:
        self.state.index.clear()
        self.state.tracker.reset()
        self.counters.reset(self.state.source.url, reason)

    async def _initial_replay(self) -> None:
        replayed, last_seq = 0, None
        try:
            async for m in self._replay(0, None):
                if self.state.tracker.classify(m.seq) in (ke.NEXT, ke.GAP):
                    _apply(self.state, m, self.counters)
                replayed, last_seq = replayed + 1, m.seq
        except _ReplayFailed:
            if replayed:  # part of the past only: start from nothing
                self._reset("joined_late")
            return
        if last_seq is not None:
            self.state.tracker.replayed(last_seq)
        self.state.synced = True
        log.info("KV events of %s: synced (%d batches replayed)", self.state.source.url, replayed)

    async def _replay(self, start: int, stop: int | None):
        """Yield the batches [start, stop) from the replay endpoint, one at a time; raise
        _ReplayFailed when it does not answer in time (each batch within REPLAY_TIMEOUT_S of the
        last), sends more than _MAX_REPLAYED, or a message past the bounds."""
        if not self.state.source.replay:
            raise _ReplayFailed("no replay endpoint")
        # An engine that is down must not stall the stream: the connection, and each next batch, must come
        # within REPLAY_TIMEOUT_S (the time applying what came is not counted; _MAX_REPLAYED bounds the rest).
        count = 0
        dealer: zmtp.Connection | None = None
        try:
            try:
                async with asyncio.timeout(REPLAY_TIMEOUT_S):
                    dealer = await zmtp.Connection.open(self.state.source.replay, zmtp.DEALER)
                    await dealer.send_multipart(ke.encode_replay_request(start))
            except (OSError, TimeoutError, asyncio.IncompleteReadError, zmtp.ProtocolError) as exc:
                raise _ReplayFailed(f"connect: {exc!r}") from None
            while True:
                try:
                    async with asyncio.timeout(REPLAY_TIMEOUT_S):
                        frames = await self._recv(dealer, _REPLAY_FRAMES)
                except (TimeoutError, asyncio.IncompleteReadError, OSError, zmtp.ProtocolError) as exc:
                    raise _ReplayFailed(f"{exc!r}") from None  # the connection is dropped in any case
                if ke.is_replay_end(frames):
                    return
                msg = safe_decode(frames[1:], max_bytes=self.max_bytes,  # drop the delimiter
                                  max_decoded_bytes=self.max_decoded_bytes)
                if isinstance(msg, str):
                    self.counters.dropped(self.state.source.url, msg)
                    continue
                if stop is not None and msg.seq >= stop:
                    continue
                count += 1
                if count > _MAX_REPLAYED:
                    raise _ReplayFailed("too many batches")
                yield msg
        finally:
            if dealer is not None:
                dealer.close()
