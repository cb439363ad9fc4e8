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
A wrong guess here can only cost a cache hit on an engine (the router routes
elsewhere), never change an answer: engines hash their own tokens.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from pdfleet.connector.router.kvaware.kv_events import hash_key
from pdfleet.connector.router.kvaware.prefix_hash import BlockHasher

DEFAULT_CHUNK_CHARS = 256
# Bounded in bytes, not entries: a chunk of 256 characters holds from ~40 tokens (English) to
# 256+ (digits, CJK, byte soup), and a chunk without a safe cut passes its tokens to the next.
DEFAULT_MAX_BYTES = 32 * 1024 * 1024
# Per chunk besides its ids and keys: the OrderedDict entry and its int key, the _Chunk (slots),
# two array headers and the 32-byte block hash (measured with tracemalloc, see the tests).
CHUNK_OVERHEAD_BYTES = 400


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


def chunk_bytes(n_ids: int, n_keys: int) -> int:
    """What one chunk costs the cache, in bytes (the bound counts this)."""
    return CHUNK_OVERHEAD_BYTES + 4 * n_ids + 8 * n_keys


@dataclass
class Cached:
    """What the cache knows of a prompt: a token prefix (up to ``chars``) and its block keys."""

    chars: int
    ids: list[int]
    keys: list[int]
    last_hash: bytes | None
    chain: list[int]  # the chunk keys walked (the next chunk chains on the last)


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
        self._chunks: OrderedDict[int, _Chunk] = OrderedDict()

    def _put(self, key: int, chunk: _Chunk) -> None:
        old = self._chunks.get(key)
        if old is not None:
            self.bytes -= chunk_bytes(len(old.ids), len(old.keys or ()))
        self._chunks[key] = chunk
        self._chunks.move_to_end(key)
        self.bytes += chunk_bytes(len(chunk.ids), len(chunk.keys or ()))

    def _evict(self) -> None:
        while self.bytes > self.max_bytes and self._chunks:
            _, old = self._chunks.popitem(last=False)
            self.bytes -= chunk_bytes(len(old.ids), len(old.keys or ()))

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
                chunk = _Chunk(chunk.cut, chunk.ids, array("Q", (hash_key(h) for h in hashes)),
                               hashes[-1] if hashes else found.last_hash)
                self._put(key, chunk)
                self._evict()  # never the chunk just put (it is the newest)
            found.keys.extend(chunk.keys)
            found.chars = chunk.cut
            found.last_hash = chunk.last_hash
            found.chain.append(key)
            parent = key
        return found

    def store(self, text: str, hit: Cached, tail: Encoding) -> None:
        """Remember the chunks of ``text`` after ``hit``, given the tokens of ``text[hit.chars:]``
        (their block keys are computed when they are found again)."""
        c = self.chunk_chars
        parent = hit.chain[-1]
        first = len(hit.chain) - 1  # index of the first chunk not cached
        prev_cut, prev_tok = hit.chars, 0
        for i in range(first, len(text) // c):
            end = (i + 1) * c
            # the last safe cut strictly inside this chunk (its space must be part of the key)
            found = last_safe_cut(text, hit.chars, max(prev_cut + 1, i * c), end, tail)
            cut, tok = found if found is not None else (prev_cut, prev_tok)
            key = chunk_key(parent, text[i * c:end])
            self._put(key, _Chunk(cut, array("I", tail.ids[prev_tok:tok]), None, None))
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
           "next_safe_cut", "DEFAULT_CHUNK_CHARS", "DEFAULT_MAX_BYTES"]
