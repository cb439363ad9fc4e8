"""KV-cache-aware endpoint choice: the router's glue between requests, event streams and scoring.

For each leg under ``prefixAware`` the router

1. turns the request into prefix keys: the prompt's block hashes as the
   engines compute them (tokenizer of the served model + prefix_hash), and
   chained hashes of its text (for the approximate index);
2. scores every candidate by its cached prefix: from the engine's own KV
   events when every candidate's stream is synced, else from what the router
   routed itself (RoutedIndex), else nothing (then least outstanding);
3. lets prefix_scoring.choose_endpoint pick under the load bound.

Subscribers (kv_subscriber.py) run for every endpoint that advertises a KV
event endpoint, in the router's event loop. The keys are prefix_keys.py's, the
tokenizer tokenizer.py's.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from pdfleet.connector.router.kvaware import kv_events as ke
from pdfleet.connector.router.endpoint_labels import UNKNOWN, EndpointLabels
from pdfleet.connector.router.endpoints import DECODE, PREFILL, RevisionEndpoints
from pdfleet.connector.router.kvaware.kv_subscriber import Budget, Counters, EndpointState, EventSource, Subscriber, plan_budget
from pdfleet.connector.router.kvaware.prefix_hash import TEXT_CHUNK_CHARS, BlockHasher, HashConfig, text_keys
from pdfleet.connector.router.kvaware.prefix_keys import LazyKeys, PromptKeys, match_lengths, prompt_text
from pdfleet.connector.router.kvaware.prefix_scoring import Choice, RoutedIndex, choose_endpoint
from pdfleet.contract.routing import LEAST_OUTSTANDING, PREFIX_AWARE
from pdfleet.connector.router.kvaware.prompt_tokens import Cached, PromptTokenCache, next_safe_cut
from pdfleet.connector.router.kvaware.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger("pdfleet.router.prefix")

UNKNOWN_ENDPOINT = UNKNOWN
EVENTS = "events"
ROUTED = "routed"
MIXED = "mixed"
_CHARS_PER_TOKEN = 4  # for the routed index's token estimate only
# Past the prompt token cache a prompt is tokenized a piece at a time, as far as scoring asks: the
# first piece about one block long (scoring usually stops at the first block past the cache), each
# next one twice as long, up to _MAX_PIECE_CHARS.
_MIN_PIECE_CHARS, _MAX_PIECE_CHARS = 64, 4096
_MAX_REMEMBERING = 16  # prompts queued for remembering; past this new prompts are not remembered


class _MetricCounters(Counters):
    def __init__(self, metrics: Any, known: Callable[[str], bool], names: Callable[[str], str]) -> None:
        self.m = metrics
        self.known = known
        self.names = names  # the endpoint's name in metrics (endpoint_labels.py), never its URL

    def _label(self, url: str) -> str:
        return self.names(url) if self.known(url) else UNKNOWN_ENDPOINT

    def received(self, url: str) -> None:
        self.m.kv_events_received.labels(self._label(url)).inc()

    def dropped(self, url: str, reason: str) -> None:
        self.m.kv_events_dropped.labels(self._label(url), reason).inc()

    def reset(self, url: str, reason: str) -> None:
        self.m.kv_index_resets.labels(self._label(url), reason).inc()

    def index_size(self, url: str, size: int) -> None:
        self.m.kv_index_blocks.labels(self._label(url)).set(size)


class PrefixRouting:
    """Per-router state of KV-aware routing (one event loop owns it)."""

    def __init__(self, config: Any, metrics: Any, *, tokenize: Callable[[str], list[int]] | None = None,
                 labels: EndpointLabels | None = None) -> None:
        self.config = config
        # The router's endpoint names (it updates them); standalone, this names its own endpoints.
        self._own_labels = labels is None
        self.labels = labels if labels is not None else EndpointLabels()
        self.metrics = metrics
        self.policies = {PREFILL: config.prefill_policy, DECODE: config.decode_policy}
        self.hasher = BlockHasher(HashConfig(config.block_size, config.hash_algo, config.hash_seed))
        self._tokenize = tokenize
        self._tokenizer_loaded = tokenize is not None
        self._token_cache: PromptTokenCache | None = None
        self._use_token_cache(tokenize)
        self._executor: ThreadPoolExecutor | None = None
        self._remembering = 0
        self._remember_tasks: set[asyncio.Future] = set()
        self._stopped = False
        self._tokenizer_task: asyncio.Task | None = None
        self.routed = RoutedIndex()
        self.states: dict[str, EndpointState] = {}
        self._tasks: dict[str, asyncio.Task] = {}
        self._sources: dict[str, EventSource] = {}
        self.budget = self._plan(0)  # each publisher's share of the KV-event memory (kv_subscriber.plan_budget)
        self._budgets: dict[str, Budget] = {}  # what each running subscriber was started with
        self._resume: set[str] = set()  # subscribers to start again on their kept state
        self._ctx = None
        self._running = False
        self.counters = _MetricCounters(metrics, lambda u: u in self.states, self.labels)
        self._keys: OrderedDict[int, tuple[Any, PromptKeys]] = OrderedDict()
        self._accounts: dict[tuple[str, str | None], tuple[Any, Any, Any]] = {}

    def enabled(self, role: str) -> bool:
        return self.policies.get(role) == PREFIX_AWARE

    # ---- endpoints and subscribers --------------------------------------------

    def set_endpoints(self, groups: Iterable[RevisionEndpoints]) -> None:
        sources: dict[str, EventSource] = {}
        for g in groups:
            for ep in (*g.prefill, *g.decode):
                if getattr(ep, "kv_events", None):
                    sources[ep.url] = EventSource(ep.url, ep.kv_events, getattr(ep, "kv_events_replay", None))
        self._sources = sources
        for url in list(self.states):
            if url not in sources or self.states[url].source != sources[url]:
                self._drop(url)  # endpoint gone (or moved): what we knew of it is void
        for url in list(self.routed._keys):
            if not any(url in (e.url for e in (*g.prefill, *g.decode)) for g in groups):
                self.routed.forget(url)
        self.budget = budget = self._plan(len(sources))
        for url, src in sources.items():
            if url not in self.states:
                self.states[url] = EndpointState(src, ke.BlockIndex(budget.index_blocks))
            else:
                self.states[url].index.max_blocks = budget.index_blocks  # applied with the next batch
        for url, started in list(self._budgets.items()):
            if url in self._tasks and (started.depth > budget.depth or started.max_bytes > budget.max_bytes):
                self._tasks.pop(url).cancel()  # its queues outgrew its share: started again (resuming) below
                self._budgets.pop(url)
                self._resume.add(url)
        if self._own_labels:
            self.labels.update({e.url: role for g in groups for role, eps in ((PREFILL, g.prefill), (DECODE, g.decode))
                                for e in eps})
        if self._running:
            self._start_missing()

    def _plan(self, publishers: int) -> Budget:
        c = self.config
        return plan_budget(publishers, total_bytes=c.kv_events_max_total_bytes,
                           max_bytes=c.kv_events_max_message_bytes, index_max_blocks=c.kv_index_max_blocks)

    def _drop(self, url: str) -> None:
        self._budgets.pop(url, None)
        self._resume.discard(url)
        task = self._tasks.pop(url, None)
        if task is not None:
            task.cancel()
        self.states.pop(url, None)
        for metric in (self.metrics.kv_index_blocks, self.metrics.kv_events_received):
            try:
                metric.remove(self.labels(url))
            except KeyError:
                pass

    def _start_missing(self) -> None:
        import zmq.asyncio

        if self._ctx is None:
            self._ctx = zmq.asyncio.Context()
        for url, state in self.states.items():
            if url not in self._tasks:
                sub = Subscriber(state, self.counters, self._ctx, max_bytes=self.budget.max_bytes,
                                 depth=self.budget.depth, resume=url in self._resume)
                self._resume.discard(url)
                self._budgets[url] = self.budget
                self._tasks[url] = asyncio.create_task(sub.run_forever(), name=f"kv-events {url}")

    async def start(self) -> None:
        if not (self.enabled(PREFILL) or self.enabled(DECODE)):
            return
        self._running, self._stopped = True, False
        self._start_missing()
        if not self._tokenizer_loaded:
            # In the background: the router serves (scoring from its routed index) while it loads.
            self._tokenizer_loaded = True
            self._tokenizer_task = asyncio.create_task(self._load_tokenizer())

    async def _load_tokenizer(self) -> None:
        tokenize = await asyncio.to_thread(load_tokenizer, self.config.tokenizer)
        if tokenize is not None:
            self._use_token_cache(tokenize)
            log.info("prefix routing hashes prompts with the tokenizer of %s (prompt token cache %s)",
                     self.config.tokenizer, "on" if self._token_cache is not None else "off: it does not compose")
        self._tokenize = tokenize

    def _use_token_cache(self, tokenize: Any) -> None:
        encode = getattr(tokenize, "encode", None)
        if encode is not None and getattr(tokenize, "composes", False):
            self._token_cache = PromptTokenCache(max_bytes=self.config.prompt_cache_max_bytes)

    async def wait_ready(self) -> None:
        """Until the tokenizer is loaded (or failed to load); for tests and benchmarks."""
        if self._tokenizer_task is not None:
            await asyncio.shield(self._tokenizer_task)

    async def stop(self) -> None:
        self._running = False
        self._stopped = True  # no prompt is handed to the worker any more
        if self._tokenizer_task is not None and not self._tokenizer_task.done():
            self._tokenizer_task.cancel()
        tasks = list(self._tasks.values())
        self._tasks.clear()
        self._budgets.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def status(self) -> dict[str, Any]:
        """For /health: the policies, whether prompts can be hashed, and each event stream."""
        return {
            "prefill_policy": self.policies[PREFILL], "decode_policy": self.policies[DECODE],
            "tokenizer": self._tokenize is not None,
            "streams": {url: {"synced": s.synced, "batches": s.received, "blocks": len(s.index),
                              "last_seq": s.tracker.last} for url, s in self.states.items()},
        }

    # ---- choosing ----------------------------------------------------------------

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
                rendered = self._tokenize.render_chat(body) if hasattr(self._tokenize, "render_chat") else None
                if rendered is not None and self._token_cache is not None:
                    source, known = self._cached_keys(rendered, salt, special=False)
                elif rendered is not None:
                    tokens = list(self._tokenize.encode(rendered, False).ids)
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, str) and self._tokenize is not None:
                    if self._token_cache is not None:
                        source, known = self._cached_keys(prompt, salt, special=True)
                    else:
                        tokens = self._tokenize(prompt)
                elif isinstance(prompt, list) and prompt and all(type(t) is int and t >= 0 for t in prompt):
                    tokens = prompt
        except Exception as exc:  # a tokenizer or template failure must not fail the request
            log.warning("tokenizing a prompt failed: %r", exc)
        text = prompt_text(body, chat)
        keys = PromptKeys(tokens, salt, text_keys(text) if text else [], source, known)
        self._keys[id(body)] = (body, keys)
        while len(self._keys) > 256:
            self._keys.popitem(last=False)
        return keys

    def _cached_keys(self, prompt: str, salt: str | None, special: bool) -> tuple[Iterator[int], list[int]]:
        """Block keys of a prompt: the prompt token cache's, then the rest tokenized a piece at a
        time as far as scoring asks (it stops at the first block no endpoint holds). The whole
        prompt is remembered for later requests off the event loop (tokenizers releases the GIL
        in encode_batch); its blocks are hashed only if a later request finds them."""
        assert self._token_cache is not None
        hit = self._token_cache.lookup(prompt, self.hasher, salt, special)
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
            piece = first_piece_chars(self.config.block_size, hit.chars, len(tokens), done)
            while pos < len(prompt):
                end = next_safe_cut(prompt, pos + piece)
                tokens += self._tokenize.ids(prompt[pos:end], special and pos == 0)  # BOS at the start only
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
            self._store(prompt, hit, self._tokenize.encode(rest, bos))
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
        work = loop.run_in_executor(self._executor, self._tokenize.encode_unlocked, rest, bos)

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
            assert self._token_cache is not None
            self._token_cache.store(prompt, hit, tail)
        except Exception as exc:
            log.warning("remembering a prompt's tokens failed: %r", exc)

    async def settle(self) -> None:
        """Until prompts being remembered are stored (tests and benchmarks)."""
        while self._remember_tasks:
            await asyncio.gather(*list(self._remember_tasks), return_exceptions=True)
            await asyncio.sleep(0)

    def pick(self, role: str, candidates: Sequence[str], body: Mapping[str, Any], *, chat: bool,
             outstanding: Mapping[str, int], exclude: Collection[str], ejected: Collection[str],
             tiebreak: int) -> str | None:
        keys = self.keys_for(body, chat)
        allowed = [c for c in candidates if c not in exclude]
        cached, source = self._cached(allowed, keys)
        choice = choose_endpoint(candidates, cached, outstanding, exclude=exclude, ejected=ejected,
                                 max_imbalance=self.config.prefix_max_imbalance, tiebreak=tiebreak)
        self._account(role, source, choice)
        if choice.url is not None and keys.text:
            self.routed.record(choice.url, keys.text)
        return choice.url

    def preview(self, role: str, candidates: Sequence[str], body: Mapping[str, Any], *, chat: bool,
                outstanding: Mapping[str, int], ejected: Collection[str], tiebreak: int,
                enough: Callable[[int], int]) -> tuple[str | None, int, int]:
        """What ``pick`` would choose among ``candidates``, without counting or remembering the choice:
        (url, its cached prefix in tokens, the prompt's tokens). The prompt is counted in whole blocks and
        only as far as ``enough(cached)`` tokens (a long prompt is not tokenized to its end for this);
        without a tokenizer it is estimated from its text, and assumed long when there is none."""
        keys = self.keys_for(body, chat)
        allowed = list(candidates)
        cached, _ = self._cached(allowed, keys) if self.enabled(role) else ({}, None)
        choice = choose_endpoint(candidates, cached, outstanding, ejected=ejected,
                                 max_imbalance=self.config.prefix_max_imbalance, tiebreak=tiebreak)
        want = enough(choice.cached_tokens)
        if keys.has_exact:
            block = self.config.block_size
            tokens = len(keys.lazy(self.hasher).first(-(-want // block))) * block
        else:
            text = prompt_text(body, chat)
            tokens = len(text) // _CHARS_PER_TOKEN if text is not None else want
        return choice.url, choice.cached_tokens, tokens

    def _cached(self, allowed: Sequence[str], keys: PromptKeys) -> tuple[dict[str, int], str | None]:
        """Cached prompt-prefix tokens per endpoint, and what scored them."""
        # Endpoints whose event stream is synced are scored from it; the others from what
        # the router routed there itself (an estimate in tokens).
        exact = {}
        if keys.has_exact:
            exact = {c: s.index.hashes.__contains__ for c in allowed
                     if (s := self.states.get(c)) is not None and s.synced}
        approx = [c for c in allowed if c not in exact]
        cached: dict[str, int] = {}
        if exact:
            blocks = match_lengths(keys.lazy(self.hasher), exact)
            cached.update((c, n * self.config.block_size) for c, n in blocks.items())
        if approx and keys.text:
            chunks = match_lengths(keys.text, {c: self.routed.holds(c) for c in approx})
            cached.update((c, n * TEXT_CHUNK_CHARS // _CHARS_PER_TOKEN) for c, n in chunks.items())
        source = (EVENTS if not approx else MIXED if exact else ROUTED if keys.text else None) if allowed else None
        return cached, source

    def _account(self, role: str, source: str | None, choice: Choice) -> None:
        # prometheus children resolved once: labels() costs more than the update itself
        counters = self._accounts.get((role, source))
        if counters is None:
            m = self.metrics
            counters = self._accounts[(role, source)] = (
                m.prefix_decisions.labels(role, source or "none"),
                m.prefix_cached_tokens.labels(role, "chosen", source) if source is not None else None,
                m.prefix_cached_tokens.labels(role, "available", source) if source is not None else None)
        decisions, chosen, available = counters
        decisions.inc()
        if chosen is not None:
            chosen.inc(choice.cached_tokens)
            available.inc(choice.best_tokens)


def first_piece_chars(block_size: int, chars: int, tokens: int, blocks: int) -> int:
    """Characters to tokenize first past a cached prefix of ``chars`` characters, ``tokens`` tokens and
    ``blocks`` whole blocks: enough to complete the next block at the prefix's characters per token
    (4 when nothing is cached), with a quarter more for margin (pure)."""
    per_token = chars / tokens if tokens and chars else _CHARS_PER_TOKEN
    wanted = max(1, block_size * (blocks + 1) - tokens)
    return max(_MIN_PIECE_CHARS, min(_MAX_PIECE_CHARS, int(wanted * per_token * 1.25)))


__all__ = ["PrefixRouting", "PromptKeys", "LazyKeys", "match_lengths", "prompt_text", "load_tokenizer", "Tokenizer",
           "LEAST_OUTSTANDING", "PREFIX_AWARE"]
