"""The tiered block index (issue 40): blocks keyed by (endpoint, medium), reference-counted announcements,
a bound per tier, and scores by the best tier holding each block, weighted; each row with a negative control.

Events are shaped as vLLM 0.32 publishes them (vllm/distributed/kv_events.py; the OffloadingConnector's
vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py): self-describing stores carry every block
hash of an offloaded chunk with its tokens, parent and block size; placeholders carry one hash (the chunk's
last block), no tokens and block size 0; GPU events without a medium are the engine's own cache.
"""

from __future__ import annotations

import msgspec
import pytest

from pdfleet.connector.serving.endpoints import DECODE
from pdfleet.connector.serving.kvaware import kv_events as ke
from pdfleet.connector.serving.kvaware.kv_subscriber import EndpointState, EventSource
from pdfleet.connector.serving.kvaware.prefix_routing import PrefixRouting
from pdfleet.connector.serving.kvaware.prefix_scoring import tier_order, weighted_tokens
from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.connector.serving.picking import chain, profiles
from pdfleet.connector.serving.picking.chain import PickRequest, PickState
from pdfleet.contract.kv_tiers import DEFAULT_TIER_WEIGHTS, MEDIUMS
from pdfleet.contract.router_config import RouterConfig
from pdfleet.contract.routing import PREFIX_AWARE

BS = 16
GPU_ONLY = (("GPU", 1.0), ("CPU", 0.0), ("STORAGE", 0.0))  # the index before tiers


def self_describing(*hashes, medium="CPU", parent=None):
    return {"type": "BlockStored", "block_hashes": list(hashes), "parent_block_hash": parent,
            "token_ids": list(range(BS * len(hashes))), "block_size": BS, "lora_id": None, "medium": medium,
            "lora_name": None, "extra_keys": None, "group_idx": 0, "kv_cache_spec_kind": "full_attention",
            "kv_cache_spec_sliding_window": None, "locality": None, "ownership": None}


def placeholder(chunk_last_hash, medium="CPU"):
    return {"type": "BlockStored", "block_hashes": [chunk_last_hash], "parent_block_hash": None, "token_ids": [],
            "block_size": 0, "lora_id": None, "medium": medium, "lora_name": None, "group_idx": 0,
            "locality": None, "ownership": None}


def gpu_store(*hashes, medium="GPU"):
    return self_describing(*hashes, medium=medium)


def removed(*hashes, medium="CPU"):
    return {"type": "BlockRemoved", "block_hashes": list(hashes), "medium": medium, "group_idx": 0,
            "locality": None, "ownership": None}


def index_after(*events, media=MEDIUMS, max_blocks=1000) -> ke.BlockIndex:
    idx = ke.BlockIndex(max_blocks, media)
    msg = ke.decode_message([b"", (0).to_bytes(8, "big"), msgspec.msgpack.encode([1.0, list(events), 0])])
    assert isinstance(msg, ke.Message) and not msg.unknown_events
    idx.apply(msg.events)
    return idx


def prefix(idx: ke.BlockIndex, keys, order=("GPU", "CPU", "STORAGE")) -> dict[str, int]:
    """Blocks of the prompt ``keys`` by the best tier holding each, up to the first block none holds."""
    n = 0
    while n < len(keys) and idx.holds(keys[n]):
        n += 1
    return idx.best(keys[:n], order)


CHUNK = [11, 12, 13, 14]  # one offloaded chunk of 4 engine blocks; its placeholder announces 14 only

# (case, events, the prompt's block keys, blocks by tier, the same under GPU_ONLY: the negative control)
ROWS = [
    ("self-describing: every block of the chunk", [self_describing(*CHUNK)], CHUNK, {"CPU": 4}, {}),
    ("placeholder: the chunk's last hash only, so the prefix stops at its first block",
     [placeholder(14)], CHUNK, {}, {}),
    ("placeholder of a one-block chunk matches by hash", [placeholder(11)], CHUNK, {"CPU": 1}, {}),
    ("placeholder beside a GPU prefix: matched where the walk reaches it",
     [gpu_store(11, 12, 13), placeholder(14)], CHUNK, {"GPU": 3, "CPU": 1}, {"GPU": 3}),
    ("an event without a medium is the GPU's (older vLLM)", [{**gpu_store(11, 12), "medium": None}], CHUNK,
     {"GPU": 2}, {"GPU": 2}),
    ("a block in both tiers counts as GPU (the best)", [gpu_store(11, 12), self_describing(*CHUNK)], CHUNK,
     {"GPU": 2, "CPU": 2}, {"GPU": 2}),
    ("GPU evicted, the CPU copy lives (llm-d-kv-cache #561)",
     [gpu_store(*CHUNK), self_describing(*CHUNK), removed(*CHUNK, medium="GPU")], CHUNK, {"CPU": 4}, {}),
    ("CPU evicted, the GPU copy lives", [gpu_store(11, 12), self_describing(*CHUNK), removed(*CHUNK)], CHUNK,
     {"GPU": 2}, {"GPU": 2}),
    ("STORAGE continues a CPU prefix", [self_describing(11, 12), self_describing(13, medium="STORAGE")], CHUNK,
     {"CPU": 2, "STORAGE": 1}, {}),
    ("another KV-cache group is not this cache", [{**self_describing(*CHUNK), "group_idx": 1}], CHUNK, {}, {}),
    ("AllBlocksCleared clears every tier", [gpu_store(11), self_describing(*CHUNK), {"type": "AllBlocksCleared"}],
     CHUNK, {}, {}),
]


@pytest.mark.parametrize("case, events, keys, tiered, gpu_only", ROWS, ids=[r[0] for r in ROWS])
def test_placeholder_and_self_describing_events(case, events, keys, tiered, gpu_only):
    assert prefix(index_after(*events), keys) == tiered
    assert prefix(index_after(*events, media=("GPU",)), keys) == gpu_only  # negative control: GPU only


# ---- repeated announcements and removes before stores -----------------------------------


def set_index(events) -> set[int]:
    """The index before issue 40 (a set per endpoint): the negative control of reference counting."""
    held: set[int] = set()
    for ev in events:
        (held.update if ev["type"] == "BlockStored" else held.difference_update)(ev["block_hashes"])
    return held


# Two chunks overlapping a shared prefix that is not chunk-aligned both announce block 12 (vLLM re-announces
# it once per chunk) and both remove it when evicted.
REPEATS = [
    ("re-announced, removed once: still held", [self_describing(11, 12), self_describing(12, 13), removed(11, 12)],
     {12, 13}),
    ("re-announced, removed twice: gone", [self_describing(11, 12), self_describing(12, 13), removed(11, 12),
                                           removed(12, 13)], set()),
    ("the same chunk stored twice (a promotion after a lookup), removed once",
     [self_describing(11, 12), self_describing(11, 12), removed(11, 12)], {11, 12}),
]


@pytest.mark.parametrize("case, events, held", REPEATS, ids=[r[0] for r in REPEATS])
def test_repeated_announcements_are_reference_counted(case, events, held):
    assert set(index_after(*events).tiers["CPU"]) == held
    if held:  # negative control: a set forgets a re-announced block at its first remove
        assert set_index(events) != held


def tombstone_index(events) -> set[int]:
    """The alternative to clamping: a remove of a block not held leaves a tombstone that cancels its next store."""
    counts: dict[int, int] = {}
    for ev in events:
        for h in ev["block_hashes"]:
            counts[h] = counts.get(h, 0) + (1 if ev["type"] == "BlockStored" else -1)
    return {h for h, n in counts.items() if n > 0}


def test_a_remove_before_its_store_is_ignored_and_the_index_stays_in_phase():
    """The router joined late (or reset): it missed block 7's store on GPU, then sees it removed, stored,
    removed and stored again, once each, as a GPU pool announces. The engine holds it at the end."""
    events = [removed(7, medium="GPU"), gpu_store(7), removed(7, medium="GPU"), gpu_store(7)]
    idx = index_after(*events)
    assert 7 in idx.hashes and idx.tiers["GPU"].unmatched == 1  # the first remove: ignored, counted
    assert 7 not in tombstone_index(events)  # negative control: a tombstone keeps it out of phase for good
    # the placeholder-keyed remove of a self-describing chunk (its metadata lost) is ignored but for its hash
    idx = index_after(self_describing(*CHUNK), removed(14), removed(99))
    assert sorted(idx.tiers["CPU"]) == [11, 12, 13] and idx.tiers["CPU"].unmatched == 1


# ---- the bound, per tier --------------------------------------------------------------------------


def test_each_tier_is_bounded_on_its_own_evicting_the_least_recently_stored():
    idx = ke.BlockIndex(max_blocks=3)
    events = lambda *evs: ke.decode_message([b"", b"\0" * 8, msgspec.msgpack.encode([1.0, list(evs), 0])]).events  # noqa: E731
    assert idx.apply(events(self_describing(1, 2, 3), gpu_store(1, 2, 3))) == {}
    assert idx.apply(events(self_describing(1), self_describing(4))) == {"CPU": 1}  # 1 re-stored: 2 is the oldest
    assert sorted(idx.tiers["CPU"]) == [1, 3, 4] and sorted(idx.hashes) == [1, 2, 3]  # GPU untouched
    assert prefix(idx, [1, 2, 3, 4]) == {"GPU": 3, "CPU": 1}  # block 2 lives on in the GPU tier
    # negative control: one bound shared by the endpoint's tiers would have evicted GPU blocks too
    assert len(idx) == 6 > idx.max_blocks
    idx.max_blocks = 1  # a smaller share (more publishers) applies with the next batch
    assert idx.apply(events()) == {"GPU": 2, "CPU": 2}
    assert list(idx.hashes) == [3] and list(idx.tiers["CPU"]) == [4]


# ---- weights ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("weights, order", [
    (DEFAULT_TIER_WEIGHTS, ("GPU", "CPU", "STORAGE")),
    (GPU_ONLY, ("GPU",)),  # a tier at 0 is not indexed
    ((("GPU", 0.5), ("CPU", 1.0), ("STORAGE", 0.5)), ("CPU", "GPU", "STORAGE")),  # best first; ties in order
])
def test_tier_order(weights, order):
    assert tier_order(dict(weights)) == order


@pytest.mark.parametrize("tokens, weights, score", [
    ({"GPU": 32, "CPU": 64}, DEFAULT_TIER_WEIGHTS, 32 + 48.0),
    ({"CPU": 64}, DEFAULT_TIER_WEIGHTS, 48.0),
    ({"STORAGE": 64}, DEFAULT_TIER_WEIGHTS, 16.0),
    ({"GPU": 32}, DEFAULT_TIER_WEIGHTS, 32),  # an int stays an int (the recorded replay compares them)
    ({"unknown": 40}, DEFAULT_TIER_WEIGHTS, 40),  # the routed index's estimate counts in full
    ({"CPU": 64}, (("GPU", 1.0), ("CPU", 1.0), ("STORAGE", 1.0)), 64),  # weights of 1: as one tier
])
def test_weighted_tokens(tokens, weights, score):
    got = weighted_tokens(tokens, dict(weights))
    assert got == score and type(got) is type(score)


# ---- through the router's scorer ---------------------------------------------------------------------

D1, D2 = "http://d1", "http://d2"
PROMPT = {"prompt": list(range(4 * BS + 3))}


def routing(weights=DEFAULT_TIER_WEIGHTS) -> tuple[PrefixRouting, list[int]]:
    r = PrefixRouting(RouterConfig(prefill=("http://p",), decode=(D1, D2), block_size=BS,
                                   prefix_tier_weights=weights), RouterMetrics())
    for url in (D1, D2):
        r.states[url] = EndpointState(EventSource(url, "ipc:///nowhere"), ke.BlockIndex(1000, r.tiers), synced=True)
    return r, list(r.keys_for(PROMPT, False).exact(r.hasher))


def feed(r: PrefixRouting, url: str, *events) -> None:
    msg = ke.decode_message([b"", b"\0" * 8, msgspec.msgpack.encode([1.0, list(events), 0])])
    r.states[url].index.apply(msg.events)


def pick(r: PrefixRouting):
    p = profiles.profile(PREFIX_AWARE, r, r.config.prefix_max_imbalance)
    return chain.run((D1, D2), PickState({}), p.filters, p.scorers, PickRequest(DECODE, PROMPT),
                     max_imbalance=p.max_imbalance)


def cached_tokens(r: PrefixRouting, **labels) -> dict[str, float]:
    return {s.labels["medium"]: s.value for m in r.metrics.prefix_cached_tokens.collect() for s in m.samples
            if s.name.endswith("_total") and all(s.labels[k] == v for k, v in labels.items())}


def test_the_router_scores_a_decode_by_its_cpu_tier_and_counts_the_tokens_by_medium():
    r, keys = routing()
    feed(r, D1, self_describing(*keys[:4]))  # 64 tokens, in D1's CPU tier only
    feed(r, D2, gpu_store(*keys[:2]))  # 32 tokens on D2's GPU
    scored = r.score((D1, D2), PROMPT, chat=False)
    assert dict(scored) == {D1: 48.0, D2: 32}  # 0.75 x 64 against 1.0 x 32
    assert pick(r).url == D1
    assert r.cached_tokens(DECODE, D1, PROMPT, chat=False) == 64  # what the Conditional decider may weigh: in full
    assert r.cached_tokens(DECODE, D2, {"prompt": list(PROMPT["prompt"])}, chat=False) == 32  # another body: scored
    r.policies[DECODE] = "leastOutstanding"
    assert r.cached_tokens(DECODE, D1, PROMPT, chat=False) == 0  # not scored by prefix: 0, as its score would be
    r.policies[DECODE] = PREFIX_AWARE
    assert cached_tokens(r, leg=DECODE, kind="chosen") == {"CPU": 64}
    feed(r, D1, gpu_store(*keys[:1]))
    pick(r)
    assert cached_tokens(r, leg=DECODE, kind="chosen") == {"CPU": 64 + 48, "GPU": 16}  # each block once, best tier


def test_negative_control_gpu_only_weights_score_the_cpu_only_decode_zero():
    r, keys = routing(GPU_ONLY)
    feed(r, D1, self_describing(*keys[:4]))
    feed(r, D2, gpu_store(*keys[:2]))
    assert dict(r.score((D1, D2), PROMPT, chat=False)) == {D1: 0, D2: 32}
    assert pick(r).url == D2 and r.cached_tokens(DECODE, D1, PROMPT, chat=False) == 0
    assert len(r.states[D1].index) == 0  # CPU events are not even kept
