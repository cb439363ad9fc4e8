"""KV-cache-aware endpoint choice: the router's glue between requests, event streams and scoring.

For each leg under ``prefixAware`` the router

1. turns the request into prefix keys: the prompt's block hashes as the
   engines compute them (tokenizer of the served model + prefix_hash), and
   chained hashes of its text (for the approximate index);
2. scores every candidate by its cached prefix: from the engine's own KV
   events when every candidate's stream is synced, else from what the router
   routed itself (RoutedIndex), else nothing (then least outstanding);
3. scores each candidate by the prompt prefix it holds (``score``), each block weighted by the best
   KV tier that holds it (GPU, CPU, STORAGE: ``--prefix-tier-weights``), for the picking chain
   (picking/prefix.py, picking/chain.py) that picks under the load bound.

Subscribers (kv_subscriber.py) run for every endpoint that advertises a KV
event endpoint, in the router's event loop. A request's keys come from
prompt_memory.py (the prompt token cache and its worker), the tokenizer from
tokenizer.py.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from pdfleet.connector.serving.kvaware import kv_events as ke
from pdfleet.connector.serving.endpoint_labels import UNKNOWN, EndpointLabels
from pdfleet.connector.serving.endpoints import DECODE, PREFILL, RevisionEndpoints
from pdfleet.connector.serving.kvaware.kv_subscriber import Budget, Counters, EndpointState, EventSource, Subscriber, plan_budget
from pdfleet.connector.serving.kvaware.prefix_hash import TEXT_CHUNK_CHARS, BlockHasher, HashConfig
from pdfleet.connector.serving.kvaware.prefix_keys import LazyKeys, PromptKeys, match_lengths, prompt_text
from pdfleet.connector.serving.kvaware.prefix_scoring import RoutedIndex, tier_order, weighted_tokens
from pdfleet.contract.kv_tiers import MEDIUM_UNKNOWN
from pdfleet.contract.routing import LEAST_OUTSTANDING, PREFIX_AWARE
from pdfleet.connector.serving.kvaware.prompt_memory import CHARS_PER_TOKEN as _CHARS_PER_TOKEN, PromptMemory
from pdfleet.connector.serving.kvaware.tokenizer import Tokenizer, load_tokenizer, load_tokenizer_reporting
from pdfleet.contract.metrics import TOKENIZER_LOADED, TOKENIZER_LOADING

log = logging.getLogger("pdfleet.router.prefix")

UNKNOWN_ENDPOINT = UNKNOWN
EVENTS = "events"
ROUTED = "routed"
MIXED = "mixed"


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

    def evicted(self, url: str, medium: str, blocks: int) -> None:
        self.m.kv_index_evicted.labels(self._label(url), medium).inc(blocks)


class CachedPrefix(dict):
    """Each endpoint's score (a dict): its cached prompt-prefix tokens, each block weighted by the best tier
    holding it; with those tokens unweighted by that tier (``tokens``: endpoint -> medium -> tokens;
    ``MEDIUM_UNKNOWN`` for the routed estimate), what scored them (``source``) and the prompt's keys."""

    __slots__ = ("source", "keys", "tokens")

    def __init__(self, tokens: dict[str, dict[str, int]], weights: Mapping[str, float], source: str | None,
                 keys: PromptKeys) -> None:
        super().__init__((c, weighted_tokens(t, weights)) for c, t in tokens.items())
        self.source, self.keys, self.tokens = source, keys, tokens

    def cached_tokens(self, url: str | None) -> int:
        """``url``'s cached prefix in tokens, every tier in full."""
        return sum(self.tokens.get(url, {}).values()) if url is not None else 0


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
        self.weights = dict(config.prefix_tier_weights)
        self.tiers = tier_order(self.weights)  # the media indexed, best first
        self.prompts = PromptMemory(self.hasher, config.prompt_cache_max_bytes, tokenize)
        self._tokenizer_loaded = tokenize is not None
        self._tokenizer_task: asyncio.Task | None = None
        self.tokenizer_reason: str | None = TOKENIZER_LOADED if tokenize is not None else None  # None: not needed
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
        self._accounts: dict[tuple[str, str | None], Any] = {}
        self._tokens: dict[tuple[str, str, str, str], Any] = {}  # (leg, kind, source, medium) -> counter
        self._last_scored: tuple[Mapping[str, Any], CachedPrefix] | None = None

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
                self.states[url] = EndpointState(src, ke.BlockIndex(budget.index_blocks, self.tiers))
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
                           max_bytes=c.kv_events_max_message_bytes, index_max_blocks=c.kv_index_max_blocks,
                           tiers=len(self.tiers))

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
        self._running = True
        self.prompts.resume()
        self._start_missing()
        if not self._tokenizer_loaded:
            # In the background: the router serves (scoring from its routed index) while it loads.
            self._tokenizer_loaded = True
            self._tokenizer_state(TOKENIZER_LOADING)
            self._tokenizer_task = asyncio.create_task(self._load_tokenizer())

    def _tokenizer_state(self, reason: str) -> None:
        self.tokenizer_reason = reason
        self.metrics.tokenizer_state(reason)

    async def _load_tokenizer(self) -> None:
        tokenize, reason = await asyncio.to_thread(load_tokenizer_reporting, self.config.tokenizer)
        self._tokenizer_state(reason)
        if tokenize is not None:
            self.prompts.use(tokenize)
            log.info("prefix routing hashes prompts with the tokenizer of %s (prompt token cache %s)",
                     self.config.tokenizer, "on" if self.prompts.cache is not None else "off: it does not compose")

    async def wait_ready(self) -> None:
        """Until the tokenizer is loaded (or failed to load); for tests and benchmarks."""
        if self._tokenizer_task is not None:
            await asyncio.shield(self._tokenizer_task)

    async def stop(self) -> None:
        self._running = False
        self.prompts.stop()  # no prompt is handed to the worker any more
        if self._tokenizer_task is not None and not self._tokenizer_task.done():
            self._tokenizer_task.cancel()
        tasks = list(self._tasks.values())
        self._tasks.clear()
        self._budgets.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None

    def status(self) -> dict[str, Any]:
        """For /health: the policies, whether prompts can be hashed, and each event stream."""
        return {
            "prefill_policy": self.policies[PREFILL], "decode_policy": self.policies[DECODE],
            "tokenizer": self.prompts.tokenize is not None,
            "tokenizer_reason": self.tokenizer_reason,  # metrics.TOKENIZER_REASONS; None: no leg is prefixAware
            "streams": {url: {"synced": s.synced, "batches": s.received, "blocks": len(s.index),
                              "tiers": s.index.sizes(), "last_seq": s.tracker.last} for url, s in self.states.items()},
        }

    # ---- choosing ----------------------------------------------------------------

    def keys_for(self, body: Mapping[str, Any], chat: bool) -> PromptKeys:
        return self.prompts.keys_for(body, chat)

    async def settle(self) -> None:
        """Until prompts being remembered are stored (tests and benchmarks)."""
        await self.prompts.settle()

    def score(self, candidates: Sequence[str], body: Mapping[str, Any], *, chat: bool) -> CachedPrefix:
        """Each candidate's cached prefix of this prompt, in tokens weighted by tier (the prefix scorer's
        score, picking/prefix.py), with the tokens per tier, what scored them and the prompt's keys."""
        keys = self.keys_for(body, chat)
        tokens, source = self._cached(candidates, keys)
        scored = CachedPrefix(tokens, self.weights, source, keys)
        self._last_scored = (body, scored)
        return scored

    def cached_tokens(self, role: str, url: str | None, body: Mapping[str, Any], *, chat: bool) -> int:
        """``url``'s cached prefix of this prompt in tokens, every tier in full, where ``role`` is scored by
        prefix (else 0, as its score would be): what the Conditional decider should weigh, since a block in
        the CPU tier is loaded, not computed. Taken from the last ``score`` of this very body when it scored
        ``url`` (the pick ``decide`` previews), else scored again."""
        if url is None or not self.enabled(role):
            return 0
        last = self._last_scored
        scored = last[1] if last is not None and last[0] is body and url in last[1].tokens else None
        if scored is None:
            scored = self.score((url,), body, chat=chat)
        return scored.cached_tokens(url)

    def chosen(self, role: str, url: str | None, scored: CachedPrefix, candidates: Sequence[str]) -> None:
        """A pick took ``url``: count what it reused and what was on offer (by tier), and remember where the
        prompt went (the estimate for endpoints without an event stream)."""
        best = max(candidates, key=lambda c: scored.get(c, 0), default=None)
        self._account(role, scored, url, best)
        if url is not None and scored.keys.text:
            self.routed.record(url, scored.keys.text)

    def prompt_tokens(self, body: Mapping[str, Any], *, chat: bool, want: int) -> int:
        """The prompt's tokens counted in whole blocks and only as far as ``want`` (a long prompt is not
        tokenized to its end for this); without a tokenizer estimated from its text, and assumed long
        when there is none."""
        keys = self.keys_for(body, chat)
        if keys.has_exact:
            block = self.config.block_size
            return len(keys.lazy(self.hasher).first(-(-want // block))) * block
        text = prompt_text(body, chat)
        return len(text) // _CHARS_PER_TOKEN if text is not None else want

    def _cached(self, allowed: Sequence[str], keys: PromptKeys) -> tuple[dict[str, dict[str, int]], str | None]:
        """Cached prompt-prefix tokens per endpoint by the best tier holding each block, and what scored
        them. A prefix runs while some tier holds the next block (docs/kv-routing.md, Tiers)."""
        # Endpoints whose event stream is synced are scored from it; the others from what
        # the router routed there itself (an estimate in tokens, its tier unknown).
        indexes = {}
        if keys.has_exact:
            indexes = {c: s.index for c in allowed if (s := self.states.get(c)) is not None and s.synced}
        approx = [c for c in allowed if c not in indexes]
        cached: dict[str, dict[str, int]] = {}
        if indexes:
            lazy = keys.lazy(self.hasher)
            blocks = match_lengths(lazy, {c: index.holds for c, index in indexes.items()})
            size = self.config.block_size
            for c, n in blocks.items():
                by_tier = indexes[c].best(lazy.first(n), self.tiers) if n else {}
                cached[c] = {m: k * size for m, k in by_tier.items()}
        if approx and keys.text:
            chunks = match_lengths(keys.text, {c: self.routed.holds(c) for c in approx})
            cached.update((c, {MEDIUM_UNKNOWN: n * TEXT_CHUNK_CHARS // _CHARS_PER_TOKEN} if n else {})
                          for c, n in chunks.items())
        source = (EVENTS if not approx else MIXED if indexes else ROUTED if keys.text else None) if allowed else None
        return cached, source

    def _account(self, role: str, scored: CachedPrefix, url: str | None, best: str | None) -> None:
        # prometheus children resolved once: labels() costs more than the update itself
        source = scored.source
        decisions = self._accounts.get((role, source))
        if decisions is None:
            decisions = self._accounts[(role, source)] = self.metrics.prefix_decisions.labels(role, source or "none")
        decisions.inc()
        if source is None:
            return
        for kind, c in (("chosen", url), ("available", best)):
            for medium, tokens in scored.tokens.get(c, {}).items() if c is not None else ():
                key = (role, kind, source, medium)
                counter = self._tokens.get(key)
                if counter is None:
                    counter = self._tokens[key] = self.metrics.prefix_cached_tokens.labels(*key)
                counter.inc(tokens)


__all__ = ["PrefixRouting", "PromptKeys", "LazyKeys", "match_lengths", "prompt_text", "load_tokenizer", "Tokenizer",
           "LEAST_OUTSTANDING", "PREFIX_AWARE"]
