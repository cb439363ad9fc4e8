"""The prompt's prefix-cache block hashes, computed the way vLLM's engines do (pure).

vLLM 0.32 chains one hash per full block of ``block_size`` tokens::

    hash[i] = H((hash[i-1] or NONE_HASH, tuple(tokens of block i), extra_keys))
    NONE_HASH = H(seed)

with ``H = sha256(canonical CBOR(obj))`` under ``--prefix-caching-hash-algo
sha256_cbor`` (what pdfleet's plan sets: it needs no Python pickling, so a
router can reproduce it), ``seed = PYTHONHASHSEED`` if the engine has it, else
``"vllm-none-hash"``, and ``extra_keys`` None for plain text prompts
(``(("cache_salt", salt),)`` on the first block of a request with a
cache_salt). Events publish the low 64 bits of each hash as an int; see
kv_events.hash_key. tests/e2e/local/test_local_two_prefills.py checks this
against a real engine's own events.

The CBOR encoder below covers exactly the shapes hashed here (bytes, str,
unsigned int, None, tuples) in canonical form (shortest lengths), as cbor2's
``canonical=True`` writes them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

from pdfleet.connector.serving.kvaware.kv_events import hash_key
from pdfleet.contract.routing import DEFAULT_HASH_SEED, PREFIX_HASH_ALGO

DEFAULT_SEED = DEFAULT_HASH_SEED
SUPPORTED_ALGOS = (PREFIX_HASH_ALGO,)


def _head(major: int, n: int) -> bytes:
    if n < 24:
        return bytes((major << 5 | n,))
    if n < 1 << 8:
        return bytes((major << 5 | 24, n))
    if n < 1 << 16:
        return bytes((major << 5 | 25,)) + n.to_bytes(2, "big")
    if n < 1 << 32:
        return bytes((major << 5 | 26,)) + n.to_bytes(4, "big")
    return bytes((major << 5 | 27,)) + n.to_bytes(8, "big")


def cbor(obj: Any) -> bytes:
    """Canonical CBOR of bytes / str / int >= 0 / None / tuple / list."""
    if obj is None:
        return b"\xf6"
    if isinstance(obj, bool):
        return b"\xf5" if obj else b"\xf4"
    if isinstance(obj, int):
        if obj < 0:
            return _head(1, -1 - obj)
        return _head(0, obj)
    if isinstance(obj, bytes):
        return _head(2, len(obj)) + obj
    if isinstance(obj, str):
        data = obj.encode("utf-8")
        return _head(3, len(data)) + data
    if isinstance(obj, (tuple, list)):
        return _head(4, len(obj)) + b"".join(cbor(x) for x in obj)
    raise TypeError(f"cannot CBOR-encode {type(obj).__name__}")


class _TokenCodes:
    """CBOR of each token id, computed once per id (the hot loop joins these)."""

    def __init__(self) -> None:
        self._codes: dict[int, bytes] = {}

    def codes(self, tokens: Sequence[int]) -> list[bytes]:
        codes = self._codes
        try:
            return [codes[t] for t in tokens]
        except (KeyError, TypeError):
            for t in tokens:
                if not isinstance(t, int) or isinstance(t, bool) or t < 0:
                    raise ValueError(f"token ids must be ints >= 0, got {t!r}") from None
                if t not in codes:
                    codes[t] = _head(0, t)
            return [codes[t] for t in tokens]


@dataclass(frozen=True)
class HashConfig:
    block_size: int
    algo: str = PREFIX_HASH_ALGO
    seed: str = DEFAULT_SEED

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"block_size: must be >= 1, got {self.block_size}")
        if self.algo not in SUPPORTED_ALGOS:
            raise ValueError(f"hash algo: the router reproduces {', '.join(SUPPORTED_ALGOS)}, got {self.algo!r}")


class BlockHasher:
    """Chained block hashes of token sequences for one engine configuration."""

    def __init__(self, config: HashConfig) -> None:
        self.config = config
        self.none_hash = hashlib.sha256(cbor(config.seed)).digest()
        self._codes = _TokenCodes()
        bs = config.block_size
        # (parent: 32-byte bstr, tokens: array of block_size, extra_keys)
        self._prefix = b"\x83" + _head(2, 32)
        self._tokens_head = _head(4, bs)

    def iter_hashes(self, token_ids: Sequence[int], cache_salt: str | None = None, *,
                    start_block: int = 0, parent: bytes | None = None) -> Iterator[bytes]:
        """Full 32-byte hashes, one per full block, lazily (callers stop at the first miss).

        ``start_block``/``parent`` resume a chain: hashes of blocks ``start_block`` on, given
        the full hash of block ``start_block - 1``.
        """
        bs = self.config.block_size
        full = len(token_ids) - len(token_ids) % bs
        first = start_block * bs
        if start_block and parent is None:
            raise ValueError("resuming a hash chain needs the parent block's hash")
        if full <= first:
            return
        # One pass encodes every token; block i is then a slice between two offsets.
        codes = self._codes.codes(token_ids[first:full])
        encoded = b"".join(codes)
        offsets = [0, *accumulate(map(len, codes))]
        parent = parent if start_block else self.none_hash
        prefix, head, sha = self._prefix, self._tokens_head, hashlib.sha256
        extra = cbor((("cache_salt", cache_salt),)) if cache_salt and not start_block else b"\xf6"
        for i in range(0, full - first, bs):
            parent = sha(b"".join((prefix, parent, head, encoded[offsets[i]:offsets[i + bs]], extra))).digest()
            extra = b"\xf6"
            yield parent

    def iter_keys(self, token_ids: Sequence[int], cache_salt: str | None = None) -> Iterator[int]:
        """Index keys (low 64 bits, as events carry them), one per full block."""
        for h in self.iter_hashes(token_ids, cache_salt):
            yield hash_key(h)

    def keys(self, token_ids: Sequence[int], cache_salt: str | None = None) -> list[int]:
        return list(self.iter_keys(token_ids, cache_salt))


# ---- text keys for the approximate index (no tokenizer, or chat) -------------------

TEXT_CHUNK_CHARS = 128


def text_keys(text: str, chunk_chars: int = TEXT_CHUNK_CHARS) -> list[int]:
    """Chained hashes of whole ``chunk_chars`` character chunks of a prompt's text.

    Used where the router cannot tokenize: what it routed itself, keyed by text
    prefixes, approximates what each engine caches. Chunks are characters.
    """
    # Python's string hash (per-process seed): the routed index never leaves this process.
    out = []
    parent = 0
    for i in range(0, len(text) - chunk_chars + 1, chunk_chars):
        parent = hash((parent, text[i:i + chunk_chars]))
        out.append(parent)
    return out
