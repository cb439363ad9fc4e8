"""The prompt token cache: cached prefixes give exactly the tokens and block keys of a full
tokenization, for real (trained) tokenizers; a tokenizer that does not compose is refused."""

from __future__ import annotations

import asyncio
import random
from bisect import bisect_left
from dataclasses import dataclass

import pytest

from pdfleet.contract.router_config import RouterConfig
from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.connector.serving.kvaware.prefix_hash import BlockHasher, HashConfig
from pdfleet.connector.serving.kvaware.prefix_routing import PrefixRouting, Tokenizer
from pdfleet.connector.serving.kvaware.prompt_tokens import (
    PromptTokenCache,
    composes,
    is_safe_at,
    last_safe_cut,
    next_safe_cut,
)
from pdfleet.operator.local.tiny_model import TinyLlamaSpec, build_corpus

BLOCK = 16


@dataclass(frozen=True)
class Encoded:
    """A prompt_tokens.Encoding from ids and each token's (start, end) character offsets."""

    ids: list[int]
    offsets: list[tuple[int, int]]

    def token_starting_at(self, char: int) -> int | None:
        starts = [s for s, _ in self.offsets]
        i = bisect_left(starts, char)
        return i if i < len(starts) and starts[i] == char else None


def _trained(pre_tokenizer: str):
    from tokenizers import Tokenizer as RustTokenizer
    from tokenizers import models, pre_tokenizers, processors, trainers

    tok = RustTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # GPT-2 / Llama-3 / Qwen style
    if pre_tokenizer == "bytelevel":
        tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    else:  # T5 style: an end-of-sequence token after every text, so a spliced prefix loses it
        tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(build_corpus(3, 3000), trainer=trainer)
    return tok


@pytest.fixture(scope="module")
def bytelevel():
    return Tokenizer(_trained("bytelevel"))


@pytest.fixture(scope="module")
def tiny():
    from pdfleet.operator.local.tiny_model import build_tokenizer

    return Tokenizer(build_tokenizer(TinyLlamaSpec())._tokenizer)


def workload(seed: int) -> list[str]:
    """System prompts of several chunks, each with many different user turns (some sharing turns)."""
    rng = random.Random(seed)
    lines = build_corpus(seed, 4000)
    systems = [" ".join(rng.sample(lines, 40)) for _ in range(3)]
    out = []
    for _ in range(40):
        s = rng.choice(systems)
        turn = " ".join(rng.sample(lines, rng.randint(1, 12)))
        sep = rng.choice(["\n\nUser: ", " ", "  ", "\t", "", "User:"])
        out.append(s + sep + turn)
        if rng.random() < 0.3:
            out.append(out[-1] + " " + " ".join(rng.sample(lines, 3)))
    out += ["", "x", "y" * 3000, " " * 700, "a" * 255 + " b c"]
    return out


@pytest.mark.parametrize("tok_name", ["bytelevel", "tiny"])
@pytest.mark.parametrize("salt", [None, "tenant-a"])
def test_cached_prefixes_give_the_full_tokenization_and_keys(tok_name, salt, request):
    tok = request.getfixturevalue(tok_name)
    assert tok.composes
    routing = PrefixRouting(RouterConfig(prefill=("http://p",), decode=("http://d",), block_size=BLOCK),
                            RouterMetrics(), tokenize=tok)
    hasher = BlockHasher(HashConfig(BLOCK))
    cache = routing.prompts.cache
    assert cache is not None
    hits = 0
    for text in workload(7):
        if text and cache.lookup(text, hasher, salt).ids:
            hits += 1
        keys = list(routing.keys_for({"prompt": text, "cache_salt": salt}, False).exact(hasher))
        want = tok(text)
        assert keys == hasher.keys(want, salt), text[:80]
        hit = cache.lookup(text, hasher, salt)  # remembered now (no event loop: at once)
        assert hit.ids == want[:len(hit.ids)], text[:80]
        assert hit.keys == hasher.keys(hit.ids[:hit.chain_ids], salt), text[:80]  # hashed when found again
    assert hits >= 20  # the cache was used, not bypassed
    assert cache.continued >= 10  # prompts sharing part of a chunk took its tokens (prompt_tokens.py)
    assert len(cache) > 0


class CountingTokenizer:
    def __init__(self, tok: Tokenizer) -> None:
        self.tok, self.composes, self.chars, self.background = tok, tok.composes, 0, 0

    def __call__(self, text):
        return self.tok(text)

    def encode(self, text, special):
        self.chars += len(text)
        return self.tok.encode(text, special)

    def encode_unlocked(self, text, special):  # in the worker thread
        self.background += len(text)
        return self.tok.encode_unlocked(text, special)


def test_scoring_tokenizes_only_as_far_as_an_endpoint_matches_and_remembers_after_the_decision(bytelevel):
    tok = CountingTokenizer(bytelevel)
    routing = PrefixRouting(RouterConfig(prefill=("http://p",), decode=("http://d",), block_size=BLOCK),
                            RouterMetrics(), tokenize=tok)
    hasher = BlockHasher(HashConfig(BLOCK))
    prompt = " ".join(build_corpus(4, 400))[:12000]
    held = set(hasher.keys(bytelevel(prompt))[:3])  # an endpoint holds the first 3 blocks only

    async def route() -> tuple[int, int, int]:
        keys = routing.keys_for({"prompt": prompt}, False)
        from pdfleet.connector.serving.kvaware.prefix_routing import match_lengths

        n = match_lengths(keys.exact(hasher), {"http://p": held.__contains__})["http://p"]
        before = tok.chars, len(routing.prompts.cache)
        await routing.settle()  # the request is on its way: remembering finishes in a worker thread
        return n, *before

    n, chars_at_decision, chunks_at_decision = asyncio.run(route())
    assert n == 3
    assert chars_at_decision < 1000  # one piece, not the 12k-character prompt
    assert chunks_at_decision == 0
    assert len(routing.prompts.cache) > 0 and tok.background == len(prompt)  # remembered afterwards, off the loop
    assert list(routing.keys_for({"prompt": prompt}, False).exact(hasher)) == hasher.keys(bytelevel(prompt))


def test_a_tokenizer_that_ends_every_text_does_not_compose():
    tok = Tokenizer(_trained("eos"))
    assert not tok.composes  # negative control: the whole text ends in </s>, a cached prefix would not
    routing = PrefixRouting(RouterConfig(prefill=("http://p",), decode=("http://d",), block_size=BLOCK),
                            RouterMetrics(), tokenize=tok)
    assert routing.prompts.cache is None


def test_splicing_without_safe_cuts_would_be_wrong(bytelevel):
    """Negative control for safe cuts: cutting inside a word gives other tokens than the whole text;
    every safe cut starts a token."""
    text = " ".join(build_corpus(1, 50))
    raw = bytelevel._encode(text, add_special_tokens=True)
    whole = Encoded(raw.ids, raw.offsets)
    wrong = 0
    for i, (s, e) in enumerate(whole.offsets):
        if e - s > 2 and i:  # cut in the middle of a multi-character token
            mid = s + 1
            spliced = list(whole.ids[:i]) + list(bytelevel.encode(text[mid:], False).ids)
            wrong += spliced != list(whole.ids)
    assert wrong > 0
    cuts = [a for a in range(1, len(text)) if is_safe_at(text, a)]
    assert cuts and all(whole.token_starting_at(a) is not None for a in cuts)
    assert all(next_safe_cut(text, a - 1) == a for a in cuts)


@pytest.mark.parametrize("text, start, lo, hi, offsets, want", [
    ("ab cd ef", 0, 1, 8, [(0, 2), (2, 5), (5, 8)], (5, 2)),  # the last one in range
    ("ab cd ef", 0, 1, 5, [(0, 2), (2, 5), (5, 8)], (2, 1)),  # hi excludes the space at 5
    ("ab  cd", 0, 1, 6, [(0, 2), (2, 3), (3, 6)], (2, 1)),  # the space at 3 follows a space: not safe
    ("x ab cd", 1, 2, 7, [(0, 3), (3, 6)], (4, 1)),  # offsets relative to start
    ("abcd efgh", 0, 1, 9, [(0, 9)], None),  # no token starts at the space
    ("abcd", 0, 1, 4, [(0, 4)], None),
])
def test_last_safe_cut_table(text, start, lo, hi, offsets, want):
    assert last_safe_cut(text, start, lo, hi, Encoded([0] * len(offsets), offsets)) == want


def test_lru_bounds_the_bytes_and_eviction_only_shortens_hits(bytelevel):
    small = PromptTokenCache(chunk_chars=64, max_bytes=2500)
    text = " ".join(build_corpus(2, 200))[:2000]
    whole = bytelevel.encode(text, True)
    hasher = BlockHasher(HashConfig(BLOCK))
    small.store(text, small.lookup(text, hasher), whole)
    assert 0 < small.bytes <= 2500 and 1 <= len(small) < len(text) // 64
    hit = small.lookup(text, hasher)
    assert hit.ids == [] and hit.chars == 0  # the first chunks were evicted: the chain starts nowhere


@pytest.mark.parametrize("kwargs, field", [({"chunk_chars": 4}, "chunk_chars"), ({"max_bytes": 10}, "max_bytes")])
def test_bad_sizes_are_refused_by_name(kwargs, field):
    with pytest.raises(ValueError, match=field):
        PromptTokenCache(**kwargs)


@pytest.mark.parametrize("text, at, want", [("ab cd", 0, 2), ("ab  cd", 3, 6), ("abcd", 0, 4), (" ab", 0, 3), ("a b", 2, 3)])
def test_next_safe_cut_table(text, at, want):
    assert next_safe_cut(text, at) == want


def test_composes_needs_a_safe_cut():
    assert not composes(lambda text, special: Encoded([1], [(0, len(text))]), "nocutshere")


def _dense_texts(n: int, seed: int) -> list[str]:
    """Token-dense prompts (digits and symbols, a space every few characters): the tiny model's
    tokenizer makes about one token a character of them, so a 256-character chunk holds ~256
    tokens (English prose: ~60)."""
    rng = random.Random(seed)
    alphabet = "0123456789#$%&*+-/=<>@^~|"
    return [" ".join("".join(rng.choice(alphabet) for _ in range(rng.randint(3, 9))) for _ in range(600))
            for _ in range(n)]


def test_cache_memory_is_bounded_in_bytes_with_the_tiny_models_tokenizer(tiny):
    """Issue 20 row 5, measured with tracemalloc: what the cache holds stays under its byte bound, and
    its own count of bytes is close to the truth. (Bounded by entries, 16,384 such chunks held
    16,384 x 256 tokens as tuples of Python ints, 8 to 36 bytes a token: 32 to 144 MiB.)"""
    import gc
    import tracemalloc

    bound = 2 * 1024 * 1024
    hasher = BlockHasher(HashConfig(BLOCK))
    texts = _dense_texts(160, 3)  # ~0.7 MB of text, ~2,700 chunks: more than the bound holds
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        cache = PromptTokenCache(max_bytes=bound)
        for text in texts:
            hit = cache.lookup(text, hasher)
            cache.store(text, hit, tiny.encode(text[hit.chars:], hit.chars == 0))
            cache.lookup(text, hasher)  # found again: its block keys are kept too
        gc.collect()
        used = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    tokens = sum(len(c.ids) for c in cache._chunks.values())
    print(f"prompt token cache: {len(cache)} chunks, {tokens} tokens, counted {cache.bytes / 2**20:.2f} MiB, "
          f"traced {used / 2**20:.2f} MiB, bound {bound / 2**20:.0f} MiB")
    assert cache.bytes <= bound
    assert used <= bound * 1.15, f"the cache holds {used} bytes, over its bound of {bound}"
    assert used >= bound * 0.6 and tokens > 20_000  # it was filled: the bound, not the input, limited it
    assert abs(used - cache.bytes) <= 0.25 * used  # its accounting is close to what it holds


@pytest.mark.parametrize("first_len, shared, cont", [
    (900, 700, True),  # the earlier prompt goes on past the chunk where the two differ
    (600, 580, True),  # the two differ inside the earlier prompt's last, partial chunk
    (900, 515, False),  # they differ before the chunk's first sub-boundary: nothing to continue with
    (900, 250, False),  # they differ inside the first chunk: no chain, no follower
])
def test_a_prompt_sharing_part_of_a_chunk_takes_its_tokens_up_to_the_last_shared_sub_cut(
        bytelevel, first_len, shared, cont):
    """Two prompts that share ``shared`` characters (chunks of 256, sub-cuts every 32): the second is
    found up to within a sub-chunk and a word of where they differ, with exactly its own tokens."""
    cache = PromptTokenCache()
    hasher = BlockHasher(HashConfig(BLOCK))
    words = " ".join(build_corpus(9, 400))
    first = words[:first_len]
    second = words[:shared] + "Zq" + words[2000:2000 + 400]
    cache.store(first, cache.lookup(first, hasher), bytelevel.encode(first, True))
    hit = cache.lookup(second, hasher)
    whole = bytelevel.encode(second, True).ids
    assert hit.ids == whole[:len(hit.ids)]  # exactly the second prompt's own tokens
    assert hit.chain_chars <= shared
    if cont:
        assert cache.continued == 1 and shared - 32 - 16 <= hit.chars <= shared, (hit.chain_chars, hit.chars)
        assert len(hit.ids) > hit.chain_ids
    else:  # negative control: nothing taken past the chain
        assert cache.continued == 0 and hit.chars == hit.chain_chars and len(hit.ids) == hit.chain_ids
    # what is stored after a continuation chains on: the second prompt is then found whole
    cache.store(second, hit, bytelevel.encode(second[hit.chars:], hit.chars == 0))
    again = cache.lookup(second, hasher)
    assert again.ids == whole[:len(again.ids)] and again.chain_chars > (len(second) // 256 - 1) * 256
