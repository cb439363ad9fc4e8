"""Pure parts of KV-cache-aware routing: scoring, prefix matching, block hashing, text keys."""

from __future__ import annotations

import hashlib

import pytest

from pdfleet.connector.serving.kvaware.prefix_hash import BlockHasher, HashConfig, cbor, text_keys
from pdfleet.connector.serving.kvaware.prefix_keys import LazyKeys
from pdfleet.connector.serving.kvaware.prefix_routing import match_lengths, prompt_text
from pdfleet.connector.serving.kvaware.prefix_scoring import RoutedIndex, matched_prefix


@pytest.mark.parametrize("held, keys, expected", [
    (set(), [1, 2, 3], 0), ({1, 2, 3}, [1, 2, 3], 3), ({1, 3}, [1, 2, 3], 1), ({2, 3}, [1, 2, 3], 0), ({1}, [], 0),
])
def test_matched_prefix(held, keys, expected):
    assert matched_prefix(keys, held.__contains__) == expected


def test_match_lengths_stops_hashing_after_the_last_match():
    pulled = []

    def keys():
        for k in range(100):
            pulled.append(k)
            yield k

    got = match_lengths(keys(), {"a": {0, 1, 2}.__contains__, "b": {0}.__contains__, "c": set().__contains__})
    assert got == {"a": 3, "b": 1, "c": 0}
    assert pulled == list(range(7))  # batches of 1, 2, 4: nothing past the one that missed
    pulled.clear()
    got = match_lengths(keys(), {"a": set(range(40)).__contains__, "b": {0}.__contains__})
    assert got == {"a": 40, "b": 1}
    assert len(pulled) == 1 + 2 + 4 + 8 + 16 + 32  # doubling batches: at most about twice what matched
    pulled.clear()
    assert match_lengths(keys(), {"a": set().__contains__, "b": {5}.__contains__}) == {"a": 0, "b": 0}
    assert pulled == [0]  # held by none: one block computed, not a batch


def test_match_lengths_computes_one_block_past_the_keys_already_taken():
    """The usual request: its first blocks known (the prompt token cache), every endpoint holding them
    and none the next; one more block is computed (tokenized and hashed on the request's path)."""
    pulled = []

    def rest():
        for k in range(10, 100):
            pulled.append(k)
            yield k

    got = match_lengths(LazyKeys(rest(), known=range(10)), {"a": set(range(10)).__contains__,
                                                             "b": {*range(10), 50}.__contains__})
    assert got == {"a": 10, "b": 10}
    assert pulled == [10]


def test_routed_index_is_bounded_lru():
    idx = RoutedIndex(max_keys=3)
    idx.record("a", [1, 2, 3])
    idx.record("a", [1, 4])  # 1 refreshed, 2 evicted
    assert [idx.holds("a")(k) for k in (1, 2, 3, 4)] == [True, False, True, True]
    assert idx.size("a") == 3 and not idx.holds("b")(1)
    idx.forget("a")
    assert idx.size("a") == 0


# ---- hashing ------------------------------------------------------------------------


def test_cbor_matches_cbor2_canonical():
    cbor2 = pytest.importorskip("cbor2")
    samples = [None, True, 0, 23, 24, 255, 256, 65535, 65536, 2**32 - 1, 2**32, b"", b"x" * 32, "vllm-none-hash",
               "é", (b"a" * 32, tuple(range(300)), None), (("cache_salt", "s"),), [1, [2, [3]]]]
    for obj in samples:
        assert cbor(obj) == cbor2.dumps(obj, canonical=True), obj


def _reference(tokens, bs, seed="vllm-none-hash", salt=None):
    """Block hashes spelled out with an independent encoder (cbor2), as vLLM's sha256_cbor hashes them."""
    cbor2 = pytest.importorskip("cbor2")
    h = lambda obj: hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()  # noqa: E731
    parent, out = h(seed), []
    for i in range(0, len(tokens) - bs + 1, bs):
        extra = (("cache_salt", salt),) if (salt and i == 0) else None
        parent = h((parent, tuple(tokens[i:i + bs]), extra))
        out.append(int.from_bytes(parent, "big") & (2**64 - 1))
    return out


@pytest.mark.parametrize("n, bs, seed, salt", [
    (0, 16, "vllm-none-hash", None), (15, 16, "vllm-none-hash", None), (100, 16, "vllm-none-hash", None),
    (100, 32, "vllm-none-hash", None), (4096, 16, "vllm-none-hash", None), (100, 32, "42", None),
    (100, 32, "vllm-none-hash", "tenant-a"),
])
def test_block_keys_match_an_independent_encoding(n, bs, seed, salt):
    tokens = [(i * 7919) % 200_000 for i in range(n)]
    assert BlockHasher(HashConfig(bs, seed=seed)).keys(tokens, salt) == _reference(tokens, bs, seed, salt)


def test_block_keys_depend_on_block_size_seed_and_every_earlier_token():
    tokens = list(range(1000, 1128))
    base = BlockHasher(HashConfig(32)).keys(tokens)
    assert len(base) == 4
    assert BlockHasher(HashConfig(16)).keys(tokens)[1] != base[0]
    assert not set(BlockHasher(HashConfig(32, seed="other")).keys(tokens)) & set(base)
    changed = BlockHasher(HashConfig(32)).keys([7] + tokens[1:])
    assert all(a != b for a, b in zip(changed, base))  # chained: a change in block 0 changes every hash


@pytest.mark.parametrize("config", [dict(block_size=0), dict(block_size=16, algo="sha256")])
def test_hash_config_refuses_what_it_cannot_reproduce(config):
    with pytest.raises(ValueError):
        HashConfig(**config)


def test_bad_token_ids_are_refused():
    with pytest.raises(ValueError, match="token ids"):
        BlockHasher(HashConfig(2)).keys([1, -1])


def test_text_keys_are_chained_prefixes():
    a = text_keys("x" * 300 + "tail A")
    b = text_keys("x" * 300 + "tail B" + "y" * 200)
    assert len(a) == 2 and a == b[:2] and len(b) == 3
    assert text_keys("short") == []


@pytest.mark.parametrize("body, chat, expected", [
    ({"prompt": "hi"}, False, "hi"),
    ({"prompt": [1, 2]}, False, "[1,2]"),
    ({"prompt": ["a", "b"]}, False, None),  # batches are not scored
    ({"messages": [{"role": "user", "content": "hi"}]}, True, '[{"role":"user","content":"hi"}]'),
    ({"messages": "x"}, True, None),
])
def test_prompt_text(body, chat, expected):
    assert prompt_text(body, chat) == expected


@pytest.mark.parametrize("block, chars, tokens, blocks, want", [
    (16, 0, 0, 0, 80),  # nothing cached: 16 tokens at 4 characters, a quarter more
    (32, 0, 0, 0, 160),
    (32, 300, 100, 3, 105),  # 3 whole blocks in 100 tokens: 28 more complete the 4th, at 3 characters a token
    (32, 500, 180, 5, 64),  # 12 more complete the 6th (41 characters): never under 64
    (16, 64, 16, 1, 80),  # 16 more at 4 characters a token
    (1, 10, 2, 2, 64),  # the floor
    (32, 1_000_000, 1_000, 31, 4096),  # 24 more at 1,000 characters a token: the ceiling
])
def test_first_piece_reaches_about_one_block_past_the_cached_prefix(block, chars, tokens, blocks, want):
    from pdfleet.connector.serving.kvaware.prompt_memory import first_piece_chars

    assert first_piece_chars(block, chars, tokens, blocks) == max(64, min(4096, int(want)))
