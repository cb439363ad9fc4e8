"""What the router knows of prompts' tokens (its I/O edge: a worker thread, the event loop's turns).

``keys_for`` turns a request into its prefix keys: the prompt token cache's
(prompt_tokens.py), then the rest tokenized a piece at a time as far as scoring
asks (it stops at the first block no endpoint holds). A prompt the cache lacks
is remembered after the decision: handed, on the loop's next turn, to a worker
thread that tokenizes it (tokenizers releases the GIL in encode_batch), then
stored. Without the cache (a tokenizer that does not compose, or none), the
prompt is tokenized whole, or only its text is keyed.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pdfleet.connector.serving.kvaware import kv_events as ke
from pdfleet.connector.serving.kvaware.prefix_hash import BlockHasher, text_keys
from pdfleet.connector.serving.kvaware.prefix_keys import PromptKeys, prompt_text
from pdfleet.connector.serving.kvaware.prompt_tokens import Cached, PromptTokenCache, next_safe_cut

log = logging.getLogger("pdfleet.router.prefix")

CHARS_PER_TOKEN = 4  # an estimate, where nothing better is known
# Past the prompt token cache a prompt is tokenized a piece at a time, as far as scoring asks: the
# first piece about one block long (scoring usually stops at the first block past the cache), each
# next one twice as long, up to _MAX_PIECE_CHARS.
_MIN_PIECE_CHARS, _MAX_PIECE_CHARS = 64, 4096
_MAX_REMEMBERING = 16  # prompts queued for remembering; past this new prompts are not remembered
_KEYS_KEPT = 256  # requests whose keys are kept (both legs and retries share them)


class PromptMemory:
    """The prompt token cache and its worker, for one event loop."""

    def __init__(self, hasher: BlockHasher, cache_max_bytes: int, tokenize: Any = None) -> None:
        self.hasher = hasher
        self.cache_max_bytes = cache_max_bytes
        self.tokenize: Any = None
        self.cache: PromptTokenCache | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._remembering = 0
        self._remember_tasks: set[asyncio.Future] = set()
        self._stopped = False
        self._keys: OrderedDict[int, tuple[Any, PromptKeys]] = OrderedDict()
        if tokenize is not None:
            self.use(tokenize)

    def use(self, tokenize: Any) -> None:
        """Hash prompts with ``tokenize`` from now on (with the cache where it composes)."""
        encode = getattr(tokenize, "encode", None)
        if encode is not None and getattr(tokenize, "composes", False):
            self.cache = PromptTokenCache(max_bytes=self.cache_max_bytes)
        self.tokenize = tokenize

    def resume(self) -> None:
        self._stopped = False

    def stop(self) -> None:
        self._stopped = True
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def keys_for(self, body: Mapping[str, Any], chat: bool) -> PromptKeys:
        entry = self._keys.get(id(body))
        if entry is not None and entry[0] is body:
            return entry[1]
        tokens = source = known = None
        salt = body.get("cache_salt")
        salt = salt if isinstance(salt, str) else None
        try:
            if chat:
                # the template writes the special tokens: none are added when tokenizing its text
                rendered = self.tokenize.render_chat(body) if hasattr(self.tokenize, "render_chat") else None
                if rendered is not None and self.cache is not None:
                    source, known = self._cached_keys(rendered, salt, special=False)
                elif rendered is not None:
                    tokens = list(self.tokenize.encode(rendered, False).ids)
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, str) and self.tokenize is not None:
                    if self.cache is not None:
                        source, known = self._cached_keys(prompt, salt, special=True)
                    else:
                        tokens = self.tokenize(prompt)
                elif isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt):
                    tokens = prompt
        except Exception as exc:  # a tokenizer or template failure must not fail the request
            log.warning("tokenizing a prompt failed: %r", exc)
        text = prompt_text(body, chat)
        keys = PromptKeys(tokens, salt, text_keys(text) if text else [], source, known)
        self._keys[id(body)] = (body, keys)
        while len(self._keys) > _KEYS_KEPT:
            self._keys.popitem(last=False)
        return keys

    def _cached_keys(self, prompt: str, salt: str | None, special: bool) -> tuple[Iterator[int], list[int]]:
        """Block keys of a prompt: the prompt token cache's, then the rest tokenized a piece at a
        time as far as scoring asks (it stops at the first block no endpoint holds). The whole
        prompt is remembered for later requests off the event loop (tokenizers releases the GIL
        in encode_batch); its blocks are hashed only if a later request finds them."""
        assert self.cache is not None
        hit = self.cache.lookup(prompt, self.hasher, salt, special)
        if hit.chars < len(prompt):
            self._remember(prompt, hit, special)
        return self._keys_after(prompt, salt, hit, special), hit.keys

    def _keys_after(self, prompt: str, salt: str | None, hit: Cached, special: bool) -> Iterator[int]:
        """The block keys after ``hit``'s."""
        tokens, parent, done, pos = list(hit.ids), hit.last_hash, len(hit.keys), hit.chars
        try:
            # blocks the known tokens complete (a continuation's) first: they need no tokenizing
            for h in self.hasher.iter_hashes(tokens, salt, start_block=done, parent=parent):
                done, parent = done + 1, h
                yield ke.hash_key(h)
            piece = first_piece_chars(self.hasher.config.block_size, hit.chars, len(tokens), done)
            while pos < len(prompt):
                end = next_safe_cut(prompt, pos + piece)
                # encode, the GIL held (BOS at the start only): encode_batch_fast would skip the offsets but
                # release the GIL mid-decision, to a thread (gRPC's, the worker) that may keep it a switch interval
                tokens += self.tokenize.encode(prompt[pos:end], special and pos == 0).ids
                pos, piece = end, min(2 * piece, _MAX_PIECE_CHARS)
                for h in self.hasher.iter_hashes(tokens, salt, start_block=done, parent=parent):
                    done, parent = done + 1, h
                    yield ke.hash_key(h)
        except Exception as exc:  # a tokenizer failure must not fail the request: score what we have
            log.warning("tokenizing a prompt failed: %r", exc)

    def _remember(self, prompt: str, hit: Cached, special: bool) -> None:
        """Tokenize what the cache lacks of a prompt and store it: in a worker thread inside the
        router's event loop (at most a few prompts queued; more are not remembered), else now.
        The worker is handed the prompt once the current decision is over (the loop's next turn):
        waking it costs the decision a thread switch, and its tokenizing would compete for the GIL."""
        rest, bos = prompt[hit.chars:], special and hit.chars == 0
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._store(prompt, hit, self.tokenize.encode(rest, bos))
            return
        if self._remembering >= _MAX_REMEMBERING:
            return
        self._remembering += 1
        fut = loop.create_future()
        self._remember_tasks.add(fut)
        fut.add_done_callback(lambda f: self._stored(f, prompt, hit))
        loop.call_soon(self._hand_to_worker, loop, fut, rest, bos)

    def _hand_to_worker(self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future, rest: str, bos: bool) -> None:
        if self._stopped:
            fut.cancel()
            return
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="pdfleet-tokenize")
        work = loop.run_in_executor(self._executor, self.tokenize.encode_unlocked, rest, bos)

        def done(w: asyncio.Future) -> None:
            if fut.done():
                return
            if w.cancelled():
                fut.cancel()
            elif w.exception() is not None:
                fut.set_exception(w.exception())
            else:
                fut.set_result(w.result())

        work.add_done_callback(done)

    def _stored(self, fut: asyncio.Future, prompt: str, hit: Cached) -> None:
        self._remembering -= 1
        self._remember_tasks.discard(fut)
        if fut.cancelled():
            return
        if fut.exception() is not None:
            log.warning("remembering a prompt's tokens failed: %r", fut.exception())
            return
        self._store(prompt, hit, fut.result())

    def _store(self, prompt: str, hit: Cached, tail: Any) -> None:
        try:
            assert self.cache is not None
            self.cache.store(prompt, hit, tail)
        except Exception as exc:
            log.warning("remembering a prompt's tokens failed: %r", exc)

    async def settle(self) -> None:
        """Until prompts being remembered are stored (tests and benchmarks)."""
        while self._remember_tasks:
            await asyncio.gather(*list(self._remember_tasks), return_exceptions=True)
            await asyncio.sleep(0)


def first_piece_chars(block_size: int, chars: int, tokens: int, blocks: int) -> int:
    """Characters to tokenize first past a cached prefix of ``chars`` characters, ``tokens`` tokens and
    ``blocks`` whole blocks: enough to complete the next block at the prefix's characters per token
    (4 when nothing is cached), with a quarter more for margin (pure)."""
    per_token = chars / tokens if tokens and chars else CHARS_PER_TOKEN
    wanted = max(1, block_size * (blocks + 1) - tokens)
    return max(_MIN_PIECE_CHARS, min(_MAX_PIECE_CHARS, int(wanted * per_token * 1.25)))


__all__ = ["CHARS_PER_TOKEN", "PromptMemory", "first_piece_chars"]
