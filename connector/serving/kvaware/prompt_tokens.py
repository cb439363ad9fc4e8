"""Token ids and block keys of prompt prefixes the router has tokenized before (pure; LRU).

Tokenizing a 4k-token prompt costs milliseconds; prompts that share a prefix
(system prompts, multi-turn chat, templates) share its tokens. The cache keys
chunks of text by a chain of hashes (chunk ``i``'s key covers characters
``[0, (i + 1) * chunk_chars)``) and keeps, per chunk, the tokens up to a *safe
cut*: a token that starts with a space after a non-space character. A
regex pre-tokenizer (GPT-2, Llama-3, Qwen byte-level BPE) always splits a word
there, so the tokens before a safe cut are the same for every text that shares
the characters up to and including it. A hit then needs only the text after
the last cached cut tokenized, and that text can be tokenized in pieces split
at safe cuts; ``composes`` checks a tokenizer once for exactly that property (a
tokenizer that fails it is never served from the cache).

Each chunk also keeps, once it is found again, the block keys (prefix_hash) of
the blocks that end within its tokens and the full hash of the last one, so
hashing resumes there; a prompt seen once is never hashed beyond what scoring
asked for.

A prompt that shares only the start of a chunk with an earlier one (a system
prompt, then a new user turn) would leave up to a chunk of shared text to
tokenize again. So each chunk also keeps *sub-cuts*: for every ``SUB_CHARS``
characters of it, the key of its text so far and the last safe cut before that
point with its token count; and each chunk remembers the chunk last stored
after it. Where the chain stops, the cache compares the prompt with that
follower sub-chunk by sub-chunk and takes its tokens up to the last sub-cut they
share (a *continuation*), so what is left to tokenize starts within a word or
two of where the prompts differ.
A wrong guess here can only cost a cache hit on an engine (the router routes
elsewhere), never change an answer: engines hash their own tokens.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from pdfleet.connector.serving.kvaware.kv_events import hash_key
from pdfleet.connector.serving.kvaware.prefix_hash import BlockHasher

DEFAULT_CHUNK_CHARS = 256
SUB_CHARS = 32  # the continuation's granularity (characters); a chunk has chunk_chars // SUB_CHARS - 1 sub-cuts
# Bounded in bytes, not entries: a chunk of 256 characters holds from ~40 tokens (English) to
# 256+ (digits, CJK, byte soup), and a chunk without a safe cut passes its tokens to the next.
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
# Per chunk besides its ids, keys and sub-cuts: the OrderedDict entry and its int key, the _Chunk
# (slots), three array headers, the 32-byte block hash and its follower entry (measured with
# tracemalloc, see the tests).
CHUNK_OVERHEAD_BYTES = 560


class Encoding(Protocol):
    """A tokenization: its ids, and which token starts at a character offset."""

    ids: Sequence[int]

    def token_starting_at(self, char: int) -> int | None: ...


@dataclass(frozen=True, slots=True)
class _Chunk:
    cut: int  # absolute character offset of the safe cut ending this chunk's tokens
    ids: array  # uint32 tokens from the previous chunk's cut to this cut (4 bytes a token, not 36)
    keys: array | None  # uint64 block keys of the blocks completed in `ids` (None: not hashed yet)
    last_hash: bytes | None  # full hash of the last completed block up to `cut`
    # (key of the chunk's text up to sub-boundary j, that boundary's last safe cut, tokens of `ids` before
    # it) for j = 0, 1, ..., flattened; a cut of 0: none in that stretch
    subs: array = field(default_factory=lambda: array("q"))


def chunk_bytes(n_ids: int, n_keys: int, n_subs: int = 0) -> int:
    """What one chunk costs the cache, in bytes (the bound counts this)."""
    return CHUNK_OVERHEAD_BYTES + 4 * n_ids + 8 * n_keys + 8 * n_subs


def _bytes(chunk: _Chunk) -> int:
    return chunk_bytes(len(chunk.ids), len(chunk.keys or ()), len(chunk.subs))


@dataclass
class Cached:
    """What the cache knows of a prompt: a token prefix (up to ``chars``) and its block keys."""

    chars: int
    ids: list[int]
    keys: list[int]
    last_hash: bytes | None
    chain: list[int]  # the chunk keys walked (the next chunk chains on the last)
    # where the chain itself ends (chars, tokens): past it, ``ids`` up to ``chars`` came from a continuation
    chain_chars: int = 0
    chain_ids: int = 0


def is_safe_at(text: str, a: int) -> bool:
    """A space after a non-space character: a regex pre-tokenizer always starts a token there."""
    return text[a] == " " and not text[a - 1].isspace()


def last_safe_cut(text: str, start: int, lo: int, hi: int, enc: Encoding, tries: int = 8) -> tuple[int, int] | None:
    """(absolute offset, token index) of the last safe cut in ``text[lo:hi]``, ``enc`` being the
    tokens of ``text[start:]`` (lo > start); None if none is found in a few tries."""
    a = hi
    for _ in range(tries):
        a = text.rfind(" ", lo, a)
        if a <= start:
            return None
        if is_safe_at(text, a):
            i = enc.token_starting_at(a - start)
            if i is not None:
                return a, i
    return None


def next_safe_cut(text: str, at: int) -> int:
    """The first safe cut at or after ``at`` (or the text's end): text split there tokenizes as
    its pieces' tokens joined, for a tokenizer that ``composes``."""
    a = at
    while a < len(text):
        a = text.find(" ", a)
        if a < 0:
            return len(text)
        if a and is_safe_at(text, a):
            return a
        a += 1
    return len(text)


def chunk_key(parent: int, chunk: str) -> int:
    # Python's string hash: the cache lives in one process, so its per-process seed is fine.
    return hash((parent, chunk))


class PromptTokenCache:
    def __init__(self, chunk_chars: int = DEFAULT_CHUNK_CHARS, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if chunk_chars < 16:
            raise ValueError(f"chunk_chars: must be >= 16, got {chunk_chars}")
        if max_bytes < CHUNK_OVERHEAD_BYTES:
            raise ValueError(f"max_bytes: must be >= {CHUNK_OVERHEAD_BYTES}, got {max_bytes}")
        self.chunk_chars = chunk_chars
        self.max_bytes = max_bytes
        self.bytes = 0  # sum of chunk_bytes over the cached chunks
        self.continued = 0  # lookups that took tokens from a continuation (tests, benchmarks)
        self._chunks: OrderedDict[int, _Chunk] = OrderedDict()
        self._follower: dict[int, int] = {}  # chunk key -> key of the chunk last stored after it

    def _put(self, key: int, chunk: _Chunk) -> None:
        old = self._chunks.get(key)
        if old is not None:
            self.bytes -= _bytes(old)
        self._chunks[key] = chunk
        self._chunks.move_to_end(key)
        self.bytes += _bytes(chunk)

    def _evict(self) -> None:
        while self.bytes > self.max_bytes and self._chunks:
            key, old = self._chunks.popitem(last=False)
            self._follower.pop(key, None)
            self.bytes -= _bytes(old)

    def __len__(self) -> int:
        return len(self._chunks)

    @staticmethod
    def root(salt: str | None, special: bool) -> int:
        return hash(("pdfleet-prompt", salt, special))

    def lookup(self, text: str, hasher: BlockHasher, salt: str | None = None, special: bool = True) -> Cached:
        """The longest cached token prefix of ``text`` (possibly empty) and its block keys;
        ``special``: whether the text is tokenized with special tokens (a completion prompt) or
        without (a rendered chat). A chunk is hashed the first time it is found again."""
        c = self.chunk_chars
        parent = self.root(salt, special)
        found = Cached(0, [], [], None, [parent])
        chunks = self._chunks
        bs = hasher.config.block_size
        for i in range(len(text) // c):
            key = chunk_key(parent, text[i * c:(i + 1) * c])
            chunk = chunks.get(key)
            if chunk is None:
                break
            chunks.move_to_end(key)
            found.ids.extend(chunk.ids)
            if chunk.keys is None:  # stored unhashed: hash the blocks that end in it, once
                done = len(found.keys)
                hashes = list(hasher.iter_hashes(found.ids[:len(found.ids) - len(found.ids) % bs], salt,
                                                 start_block=done, parent=found.last_hash))
                chunk = replace(chunk, keys=array("Q", (hash_key(h) for h in hashes)),
                                last_hash=hashes[-1] if hashes else found.last_hash)
                self._put(key, chunk)
                self._evict()  # never the chunk just put (it is the newest)
            found.keys.extend(chunk.keys)
            found.chars = chunk.cut
            found.last_hash = chunk.last_hash
            found.chain.append(key)
            parent = key
        found.chain_chars, found.chain_ids = found.chars, len(found.ids)
        self._continue(text, found)
        return found

    def _continue(self, text: str, found: Cached) -> None:
        """Past the chain's end, the tokens of the chunk last stored after it, up to the last sub-cut
        whose text this prompt shares (none where the chain is empty or the follower is gone)."""
        if len(found.chain) < 2:
            return
        parent = found.chain[-1]
        key = self._follower.get(parent)
        follower = self._chunks.get(key) if key is not None else None
        if follower is None or not follower.subs:
            return
        start = (len(found.chain) - 1) * self.chunk_chars  # where the chunk that missed begins
        subs, take = follower.subs, None
        for j in range(len(subs) // 3):
            end = start + (j + 1) * SUB_CHARS
            if end > len(text) or chunk_key(parent, text[start:end]) != subs[3 * j]:
                break
            if subs[3 * j + 1] > found.chars:
                take = j
        if take is not None:
            cut, n = subs[3 * take + 1], subs[3 * take + 2]
            found.ids.extend(follower.ids[:n])
            found.chars = cut
            self.continued += 1

    def store(self, text: str, hit: Cached, tail: Encoding) -> None:
        """Remember the chunks of ``text`` after ``hit``'s chain, given the tokens of ``text[hit.chars:]``
        (their block keys are computed when they are found again)."""
        c = self.chunk_chars
        parent = hit.chain[-1]
        first = len(hit.chain) - 1  # index of the first chunk not cached
        spliced = hit.ids[hit.chain_ids:]  # a continuation's tokens: between the chain's cut and hit.chars
        run = len(spliced)  # tokens of the run (spliced, then tail) before tail's first

        def cut_before(lo: int, hi: int) -> tuple[int, int] | None:
            """The last safe cut in text[lo:hi] past hit.chars, as (offset, index in the run)."""
            found = last_safe_cut(text, hit.chars, lo, hi, tail)
            if found is not None:
                return found[0], run + found[1]
            return (hit.chars, run) if lo <= hit.chars < hi and hit.chars > hit.chain_chars else None

        def run_ids(a: int, b: int) -> array:
            """Tokens a to b of the run."""
            ids = array("I", spliced[a:b] if a < run else ())
            ids.extend(tail.ids[max(a - run, 0):max(b - run, 0)])
            return ids

        prev_cut, prev_tok = hit.chain_chars, 0
        for i in range(first, -(-len(text) // c)):
            begin, end = i * c, min((i + 1) * c, len(text))
            lo = max(prev_cut + 1, begin)
            subs, last = array("q"), None
            for hi in range(begin + SUB_CHARS, min(end + 1, begin + c), SUB_CHARS):
                sub = cut_before(lo, hi)
                subs.extend((chunk_key(parent, text[begin:hi]),) + ((sub[0], sub[1] - prev_tok) if sub else (0, 0)))
                last = sub or last
            key = chunk_key(parent, text[begin:end])
            if end - begin < c:
                # The text's last, partial chunk: never on a chain (a chain hashes whole chunks), kept
                # only as its chunk's follower, for a later prompt that shares its start.
                if last is not None and parent in self._chunks:
                    self._put(key, _Chunk(last[0], run_ids(prev_tok, last[1]), None, None, subs))
                    self._follower[parent] = key
                break
            # the last safe cut strictly inside this chunk (its space must be part of the key)
            cut, tok = cut_before(lo, end) or (prev_cut, prev_tok)
            self._put(key, _Chunk(cut, run_ids(prev_tok, tok), None, None, subs))
            if parent in self._chunks:
                self._follower[parent] = key
            parent, prev_cut, prev_tok = key, cut, tok
        self._evict()


def composes(encode: Callable[[str, bool], Encoding], sample: str) -> bool:
    """Whether every safe cut of ``sample`` starts a token, and the tokens before it followed by
    the text after it tokenized alone (no special tokens) equal the whole text's tokens."""
    whole = encode(sample, True)
    cuts = [(a, whole.token_starting_at(a)) for a in range(1, len(sample)) if is_safe_at(sample, a)]
    if not cuts:
        return False
    for a, i in cuts:
        if i is None:  # every safe cut must start a token: prompts are tokenized in pieces split there
            return False
        if list(whole.ids[:i]) + list(encode(sample[a:], False).ids) != list(whole.ids):
            return False
    return True


__all__ = ["Cached", "Encoding", "PromptTokenCache", "chunk_bytes", "composes", "is_safe_at", "last_safe_cut",
           "next_safe_cut", "DEFAULT_CHUNK_CHARS", "DEFAULT_MAX_BYTES", "SUB_CHARS"]
