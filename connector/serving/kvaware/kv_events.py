"""vLLM's KV cache events as the router reads them (pure: no sockets here).

Each engine publishes, on a ZMQ PUB socket, multipart messages
``[topic, seq (8 bytes, big-endian), payload]`` where the payload is a
msgpack array ``[ts, events, data_parallel_rank]`` and every event is a map
tagged by ``type``: ``BlockStored`` (block_hashes, ...), ``BlockRemoved``
(block_hashes) or ``AllBlocksCleared``. A ROUTER socket beside it replays
buffered batches from a sequence number on request (see kv_subscriber.py).

This module decodes those messages with msgspec (never pickle), bounds their
sizes, keeps one endpoint's block-hash index per medium (GPU, CPU, STORAGE: the
engine's cache and its offload tiers) and decides, from the sequence numbers
alone, when a stream lost messages or restarted (StreamTracker).
The OffloadingConnector's events come in two shapes, indexed alike by hash:
self-describing (``self_describing_kv_events``: every block hash of an offloaded
chunk, with token ids, parent and block size) and placeholders (``block_size`` 0,
no token ids, one hash: the chunk's last block). A placeholder therefore matches
a prompt only at that block; with offload blocks larger than the engine's, the
chunk's earlier blocks are unknown to the router (docs/kv-routing.md, Tiers).
Block hashes are keyed as vLLM publishes them by default
(VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1): the low 64 bits of the hash as an
int; a bytes hash is folded the same way, so both forms agree.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, Union

import msgspec

from pdfleet.contract.kv_tiers import MEDIUM_GPU, MEDIUMS

HASH_MASK = (1 << 64) - 1
MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # one batch; vLLM's largest are a few hundred KiB
MAX_EVENTS_PER_BATCH = 65_536
MAX_HASHES_PER_EVENT = 65_536
MAX_HASH_BYTES = 64
# What a decoded event takes in Python objects, bounded (CPython 3.11): the struct and its list, about
# 150 bytes; per hash an 8-byte list slot and an object of at most 36 bytes (an int up to 2**64; a bytes
# hash's header is 33) and, for bytes, its content, which is no more than the event's wire size. An int
# hash that msgpack packs in 1 to 9 bytes takes about 45 decoded: up to 45x its wire size, so the wire size
# alone bounds nothing.
DECODED_EVENT_BYTES = 160
DECODED_PER_HASH = 48  # 44 measured for 64-bit ints, with the list's own slack


def decoded_size(event: Any, wire_bytes: int) -> int:
    """An upper bound of the bytes one decoded event holds (``wire_bytes``: its msgpack size)."""
    hashes = getattr(event, "block_hashes", ())
    return DECODED_EVENT_BYTES + DECODED_PER_HASH * len(hashes) + (0 if all_ints(hashes) else wire_bytes)


def all_ints(hashes: list[Any]) -> bool:
    return not hashes or (isinstance(hashes[0], int) and isinstance(hashes[-1], int)
                          and not any(isinstance(h, bytes) for h in hashes))

_Hash = Union[int, Annotated[bytes, msgspec.Meta(max_length=MAX_HASH_BYTES)]]
_Hashes = Annotated[list[_Hash], msgspec.Meta(max_length=MAX_HASHES_PER_EVENT)]


class BlockStored(msgspec.Struct, tag=True):
    # token_ids, parent_block_hash and block_size are not decoded: the router hashes prompts itself
    block_hashes: _Hashes
    medium: Union[str, None] = None
    group_idx: Union[int, None] = None


class BlockRemoved(msgspec.Struct, tag=True):
    block_hashes: _Hashes
    medium: Union[str, None] = None
    group_idx: Union[int, None] = None


class AllBlocksCleared(msgspec.Struct, tag=True):
    pass


Event = Union[BlockStored, BlockRemoved, AllBlocksCleared]


class _Batch(msgspec.Struct, array_like=True):
    ts: float
    events: Annotated[list[msgspec.Raw], msgspec.Meta(max_length=MAX_EVENTS_PER_BATCH)]
    data_parallel_rank: Union[int, None] = None


_batch_decoder = msgspec.msgpack.Decoder(_Batch)
_event_decoder = msgspec.msgpack.Decoder(Event)


def hash_key(value: int | bytes) -> int:
    """The index key of a published block hash (int or bytes form)."""
    if isinstance(value, bytes):
        return int.from_bytes(value, "big") & HASH_MASK
    return value & HASH_MASK


@dataclass(frozen=True)
class Message:
    seq: int
    events: tuple[Event, ...]
    unknown_events: int = 0  # event types this router does not know (skipped)


def decode_seq(frame: bytes) -> int | None:
    if len(frame) != 8:
        return None
    return int.from_bytes(frame, "big", signed=True)


def decode_message(frames: list[bytes], *, max_bytes: int = MAX_MESSAGE_BYTES,
                   max_decoded_bytes: int | None = None) -> Message | str:
    """One multipart message as a Message, or the reason it is dropped.

    Reasons are short metric label values: frames, oversized, bad_seq, malformed, too_deep, dp_rank.
    ``oversized``: the payload is over ``max_bytes``, or its events, decoded one by one, add up past
    ``max_decoded_bytes`` (decoding stops there: at most one event more, MAX_HASHES_PER_EVENT hashes,
    is held for a moment).
    Never raises: the subscriber's loop must survive any bytes a peer sends.
    """
    if len(frames) != 3:
        return "frames"
    _topic, seq_frame, payload = frames
    if len(payload) > max_bytes:
        return "oversized"
    seq = decode_seq(seq_frame)
    if seq is None or seq < 0:
        return "bad_seq"
    try:
        batch = _batch_decoder.decode(payload)
    except RecursionError:  # msgspec recurses even into skipped values; its recursion limit bounds the depth
        return "too_deep"
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError, TypeError):
        return "malformed"
    if batch.data_parallel_rank not in (None, 0):
        return "dp_rank"  # one engine, one data-parallel rank: another rank's blocks are not ours
    events: list[Event] = []
    unknown = 0
    decoded = 0
    for raw in batch.events:
        try:
            events.append(_event_decoder.decode(raw))
            if max_decoded_bytes is not None:
                decoded += decoded_size(events[-1], len(raw))
                if decoded > max_decoded_bytes:
                    return "oversized"
        except RecursionError:
            return "too_deep"
        except msgspec.ValidationError as exc:
            if "`$.type`" not in str(exc):
                return "malformed"  # a known event of the wrong shape: the batch cannot be trusted
            unknown += 1  # a newer vLLM's event type: skipped
        except msgspec.DecodeError:
            return "malformed"
    return Message(seq, tuple(events), unknown)


class Tier:
    """One medium's blocks on one endpoint: each hash with its announcements (stores less removes), least
    recently stored first.

    The OffloadingConnector announces a hash once per chunk that holds it (chunks overlapping a shared
    prefix that is not chunk-aligned re-announce it) and removes it as often, so a hash stays while its
    count is above 0. A remove of a hash the tier does not hold is ignored (counted in ``unmatched``): in
    one engine's stream a medium's remove never overtakes its store (one scheduler queues both), so such a
    remove is of a store the router missed (it joined late, or reset its index) or the placeholder-keyed
    remove of a chunk stored self-describing. A tombstone would instead cancel the next *real* store of
    that hash, and, on a medium that stores and removes a hash once each (GPU), keep the tier out of phase
    for that block from then on (tests/unit/router/test_kv_tiers.py shows it).
    """

    __slots__ = ("counts", "unmatched")

    def __init__(self) -> None:
        self.counts: OrderedDict[int, int] = OrderedDict()
        self.unmatched = 0

    def store(self, key: int) -> None:
        n = self.counts.get(key)
        self.counts[key] = 1 if n is None else n + 1
        if n is not None:
            self.counts.move_to_end(key)

    def remove(self, key: int) -> None:
        n = self.counts.get(key)
        if n is None:
            self.unmatched += 1
        elif n == 1:
            del self.counts[key]
        else:
            self.counts[key] = n - 1

    def trim(self, max_blocks: int) -> int:
        """Evict the least recently stored blocks down to ``max_blocks``; how many went."""
        evicted = 0
        while len(self.counts) > max_blocks:
            self.counts.popitem(last=False)
            evicted += 1
        return evicted

    def update(self, keys: Iterable[int]) -> None:
        """Store each key once (benchmarks and tests fill an index this way)."""
        for k in keys:
            self.store(k)

    def clear(self) -> None:
        self.counts.clear()  # the same dict: BlockIndex.holds closes over it

    def __len__(self) -> int:
        return len(self.counts)

    def __contains__(self, key: int) -> bool:
        return key in self.counts

    def __iter__(self) -> Iterator[int]:
        return iter(self.counts)


class BlockIndex:
    """The block hashes one engine holds, per medium (its prefix cache and its offload tiers; KV-cache
    group 0), each tier bounded at ``max_blocks`` (its least recently stored blocks evicted past it).

    ``media``: the tiers kept (those weighted above 0); events of any other medium are skipped.
    ``AllBlocksCleared`` (vLLM sends it, without a medium, when the engine resets its prefix cache) clears
    every tier: a connector's reset publishes nothing of its own, and knowing less is the safe side.
    """

    def __init__(self, max_blocks: int = 1_000_000, media: Iterable[str] = MEDIUMS) -> None:
        self.max_blocks = max_blocks  # per tier; a new bound applies with the next batch
        self.tiers = {m: Tier() for m in media}
        dicts = [t.counts for t in self.tiers.values()]
        # called per block and candidate while scoring: one dict lookup when there is one tier
        self.holds: Callable[[int], bool] = (
            dicts[0].__contains__ if len(dicts) == 1 else lambda k: any(k in d for d in dicts))

    def apply(self, events: tuple[Event, ...]) -> dict[str, int]:
        """Apply a batch in order; the blocks then evicted per medium (none: {})."""
        for ev in events:
            if isinstance(ev, AllBlocksCleared):
                self.clear()
                continue
            tier = self.tiers.get(ev.medium or MEDIUM_GPU) if ev.group_idx in (None, 0) else None
            if tier is None:
                continue
            op = tier.store if isinstance(ev, BlockStored) else tier.remove
            for h in ev.block_hashes:
                op(hash_key(h))
        evicted = {m: n for m, t in self.tiers.items() if (n := t.trim(self.max_blocks))}
        return evicted

    def best(self, keys: Iterable[int], order: Sequence[str]) -> dict[str, int]:
        """How many of ``keys`` each medium is the best holder of, ``order`` naming the best first (keys no
        tier holds are not counted)."""
        tiers = [(m, self.tiers[m].counts) for m in order if m in self.tiers]
        out: dict[str, int] = {}
        for k in keys:
            for m, d in tiers:
                if k in d:
                    out[m] = out.get(m, 0) + 1
                    break
        return out

    @property
    def hashes(self) -> Tier:
        """The GPU tier: the engine's own cache (what the index held before tiers)."""
        tier = self.tiers.get(MEDIUM_GPU)
        return Tier() if tier is None else tier  # (a Tier is falsy while empty: no `or` here)

    def sizes(self) -> dict[str, int]:
        return {m: len(t) for m, t in self.tiers.items()}

    def clear(self) -> None:
        for t in self.tiers.values():
            t.clear()

    def __len__(self) -> int:
        return sum(len(t) for t in self.tiers.values())

    def __contains__(self, key: int) -> bool:
        return self.holds(key)


# ---- sequence numbers --------------------------------------------------------------

NEXT = "next"  # apply
DUPLICATE = "duplicate"  # already applied (seen through replay): skip
GAP = "gap"  # messages lost before this one: replay [expected, seq) or reset, then apply
RESTART = "restart"  # the publisher started over: reset, then apply


@dataclass
class StreamTracker:
    """What the router knows of one endpoint's sequence numbers.

    ``last``: the last sequence number applied (None: nothing yet).
    ``replayed_upto``: after a replay, the live stream may repeat messages up to
    this number; they are duplicates, not a restart.
    """

    last: int | None = None
    replayed_upto: int | None = None

    def classify(self, seq: int) -> str:
        if self.replayed_upto is not None:
            if seq <= self.replayed_upto:
                return DUPLICATE
            self.replayed_upto = None
        if self.last is None:
            return NEXT if seq == 0 else GAP
        if seq == self.last + 1:
            return NEXT
        if seq > self.last + 1:
            return GAP
        return RESTART

    @property
    def expected(self) -> int:
        return 0 if self.last is None else self.last + 1

    def applied(self, seq: int) -> None:
        self.last = seq

    def replayed(self, upto: int) -> None:
        """A replay applied everything up to ``upto``."""
        self.last = upto if self.last is None else max(self.last, upto)
        self.replayed_upto = self.last

    def reset(self) -> None:
        self.last = None
        self.replayed_upto = None


def replay_covers(expected: int, first_replayed: int | None, upto: int) -> bool:
    """Whether a replay that began at ``first_replayed`` fills the hole [expected, upto)."""
    if upto <= expected:
        return True
    return first_replayed is not None and first_replayed <= expected


def encode_replay_request(start_seq: int) -> list[bytes]:
    """Frames a DEALER sends to vLLM's replay ROUTER socket: empty delimiter, start seq."""
    return [b"", start_seq.to_bytes(8, "big")]


def is_replay_end(frames: list[bytes]) -> bool:
    """vLLM ends a replay with ``[b"", b"", seq=-1, b""]`` (after the empty delimiter)."""
    return len(frames) == 4 and decode_seq(frames[2]) == -1


def as_dict(ev: Any) -> dict[str, Any]:  # for logs and tests
    return msgspec.structs.asdict(ev)
