"""A request's prefix keys, taken lazily: the prompt's block hashes as the engines compute them and
chained hashes of its text, and how far each endpoint holds them (pure)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice
from typing import Any

import msgspec

from pdfleet.connector.serving.kvaware.prefix_hash import BlockHasher

_json = msgspec.json.Encoder()


class LazyKeys:
    """The leading keys of an iterator, taken only as far as asked and kept (both legs and
    retries share them); ``ready`` of them are taken already and cost nothing more."""

    def __init__(self, source: Iterable[int], known: Iterable[int] = ()) -> None:
        self._source = iter(source)
        self._taken = list(known)

    @property
    def ready(self) -> int:
        return len(self._taken)

    def first(self, n: int) -> list[int]:
        """The first n keys (fewer at the end)."""
        if len(self._taken) < n:
            self._taken.extend(islice(self._source, n - len(self._taken)))
        return self._taken[:n]


@dataclass
class PromptKeys:
    tokens: list[int] | None  # None: the router cannot tokenize this request (unless `source` is given)
    cache_salt: str | None
    text: list[int]
    source: Iterator[int] | None = None  # block keys past `known`, tokenizing lazily
    known: list[int] | None = None  # the first block keys, from the prompt token cache
    _lazy: LazyKeys | None = None

    @property
    def has_exact(self) -> bool:
        return self.tokens is not None or self.source is not None

    def lazy(self, hasher: BlockHasher) -> LazyKeys:
        """The block keys, computed as far as asked."""
        if self._lazy is None:
            source = self.source if self.source is not None else hasher.iter_keys(self.tokens or (), self.cache_salt)
            self._lazy = LazyKeys(source, self.known or ())
        return self._lazy

    def exact(self, hasher: BlockHasher) -> Iterable[int]:
        """Every block key, lazily."""
        keys, n, step = self.lazy(hasher), 0, 8
        while batch := keys.first(n + step)[n:]:
            yield from batch
            n, step = n + len(batch), min(2 * step, 1024)


def match_lengths(keys: Iterable[int] | LazyKeys, holds: Mapping[str, Callable[[int], bool]]) -> dict[str, int]:
    """Leading keys held by each endpoint. Keys already taken are matched at once, the others
    taken in doubling batches from one, so at most about twice the blocks any endpoint matches,
    plus one, are computed (hashed, or tokenized then hashed): the usual request, whose prefix
    every endpoint holds up to some block and none past it, computes one block past the known."""
    lazy = keys if isinstance(keys, LazyKeys) else LazyKeys(keys)
    lengths = {u: 0 for u in holds}
    live = list(holds.items())
    n, step = 0, 1
    while live:
        want = lazy.ready if lazy.ready > n else n + step
        grows = want > lazy.ready
        batch = lazy.first(want)[n:]
        if not batch:
            break
        still = []
        for u, has in live:  # every live endpoint holds all n keys before this batch
            m = 0
            for k in batch:
                if not has(k):
                    break
                m += 1
            lengths[u] = n + m
            if m == len(batch):
                still.append((u, has))
        live, n, step = still, n + len(batch), step * 2 if grows else step
    return lengths


def prompt_text(body: Mapping[str, Any], chat: bool) -> str | None:
    if chat:
        messages = body.get("messages")
        return _json.encode(messages).decode() if isinstance(messages, list) else None
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return _json.encode(prompt).decode()
    return None


__all__ = ["LazyKeys", "PromptKeys", "match_lengths", "prompt_text"]
