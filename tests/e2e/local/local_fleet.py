"""Helpers of the `pdfleet local` end-to-end tests: the fleet as a subprocess, a single
reference server, the prompt sets, and greedy requests that return token ids."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import httpx
import yaml

from pdfleet.operator.api import parse
from pdfleet.operator.local.health import NotHealthy, wait_healthy
from pdfleet.operator.local.processes import reserve_ports, start_child, stop_groups
from pdfleet.operator.local.tiny_model import ensure_tiny_model
from pdfleet.operator.observability import metrics_text
from pdfleet.operator.plan.engine import ENGINE_MODULE, served_model_name, vllm_args

REPO = Path(__file__).resolve().parents[3]
TINY_CR = REPO / "examples" / "tiny-cpu.yaml"
STARTUP_TIMEOUT_S = 420
BLOCK = 32
FALLBACK_HEADER = "x-pdfleet-fallback"


def tiny_spec():
    return parse(yaml.safe_load(TINY_CR.read_text())).spec


MODEL = served_model_name(tiny_spec())


# --- requests -------------------------------------------------------------------


@dataclass(frozen=True)
class Req:
    label: str
    path: str
    body: dict[str, Any]

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))


@dataclass
class Answer:
    status: int
    token_ids: list[int]
    text: str
    fallback: Optional[str] = None
    error: str = ""


def completion(label: str, prompt: Any, max_tokens: int = 24, stream: bool = False) -> Req:
    return Req(label, "/v1/completions", {
        "model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True, "stream": stream,
    })


def chat(label: str, content: str, max_tokens: int = 24, stream: bool = False) -> Req:
    return Req(label, "/v1/chat/completions", {
        "model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
        "temperature": 0, "ignore_eos": True, "return_token_ids": True, "stream": stream,
    })


def _choice_text(choice: dict[str, Any]) -> str:
    if "text" in choice:
        return choice.get("text") or ""
    return (choice.get("message") or choice.get("delta") or {}).get("content") or ""


async def ask(client: httpx.AsyncClient, base: str, req: Req) -> Answer:
    try:
        if req.stream:
            ids: list[int] = []
            text: list[str] = []
            async with client.stream("POST", base + req.path, json=req.body) as resp:
                fallback = resp.headers.get(FALLBACK_HEADER)
                if resp.status_code != 200:
                    return Answer(resp.status_code, [], (await resp.aread()).decode(), fallback)
                done = False
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        continue
                    chunk = json.loads(data)
                    for choice in chunk.get("choices") or []:
                        ids += choice.get("token_ids") or []
                        text.append(_choice_text(choice))
                return Answer(200, ids, "".join(text), fallback, "" if done else "no [DONE]")
        resp = await client.post(base + req.path, json=req.body)
        fallback = resp.headers.get(FALLBACK_HEADER)
        if resp.status_code != 200:
            return Answer(resp.status_code, [], resp.text, fallback)
        choice = resp.json()["choices"][0]
        return Answer(200, list(choice.get("token_ids") or []), _choice_text(choice), fallback)
    except httpx.HTTPError as exc:
        return Answer(0, [], "", None, f"{type(exc).__name__}: {exc}")


async def ask_all(base: str, reqs: list[Req], concurrency: int) -> list[Answer]:
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
        async def one(req: Req) -> Answer:
            async with sem:
                return await ask(client, base, req)

        return await asyncio.gather(*(one(r) for r in reqs))


# --- decode's KV reused by the next turn (issue 40 part 3): conversations of token-id prompts -----------------
# Each turn's prompt: the last prompt, the last answer's token ids, a short user message; the conversation is
# named by the request's `user` (the router's conversation key). Turns 1-4 answered whole, turn 5 streamed
# (a stream is not asked to hold: nothing stays held at the end).

REUSE_MIN_TOKENS = 64  # the e2e fleet's spec.kvTransfer.decodeReuse.minReusableTokens
REUSE_TURNS = 5
REUSE_FIRST = 96  # the first prompt: three blocks
REUSE_USER = 16  # each later user message
REUSE_LONG, REUSE_SHORT = 100, 40  # answer tokens: 96 to pull a turn (three blocks), or 32 (one: under the threshold)
REUSE_CONVERSATIONS = 2  # of each kind


def reuse_conversations(model_dir: Path) -> list[tuple[str, list[int], int]]:
    """(name, first prompt and user messages, answer tokens): the short ones first, then the long ones."""
    per = REUSE_FIRST + REUSE_USER * REUSE_TURNS
    ids = corpus_ids(model_dir, 2 * REUSE_CONVERSATIONS * per)
    kinds = [("short", REUSE_SHORT)] * REUSE_CONVERSATIONS + [("long", REUSE_LONG)] * REUSE_CONVERSATIONS
    return [(f"reuse-{kind}-{c}", ids[c * per:(c + 1) * per], tokens) for c, (kind, tokens) in enumerate(kinds)]


def reuse_turn(label: str, prompt: list[int], answer_tokens: int, user: str, stream: bool) -> Req:
    return Req(label, "/v1/completions", {
        "model": MODEL, "prompt": prompt, "max_tokens": answer_tokens, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True, "stream": stream, "user": user})


async def reuse_conversation(base: str, name: str, ids: list[int], answer_tokens: int) -> list[tuple[Req, Answer]]:
    """One conversation's turns in order, each prompt built from the answers ``base`` gave."""
    out: list[tuple[Req, Answer]] = []
    prompt = ids[:REUSE_FIRST]
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
        for t in range(REUSE_TURNS):
            req = reuse_turn(f"{name} t{t + 1}", prompt, answer_tokens, name, stream=t == REUSE_TURNS - 1)
            answer = await ask(client, base, req)
            out.append((req, answer))
            if answer.status != 200:
                break
            user = ids[REUSE_FIRST + REUSE_USER * t:REUSE_FIRST + REUSE_USER * (t + 1)]
            prompt = prompt + answer.token_ids + user
    return out


async def reuse_turns(base: str, conversations: list[tuple[str, list[int], int]]) -> list[tuple[Req, Answer]]:
    """Every conversation's turns, the conversations side by side."""
    runs = await asyncio.gather(*(reuse_conversation(base, *c) for c in conversations))
    return [turn for run in runs for turn in run]


async def canary_run(pairs: dict[str, tuple[str, str]], reqs: list[Req], weight: int) -> tuple[list[Answer], dict[str, float]]:
    """``reqs`` through a router of this process whose first pair ``{name: (prefill URL, decode URL)}``
    serves and whose second is a canary at ``weight``, handed over as discovery hands over the operator's
    labels; the answers, and the requests the router answered per pair (its own per-revision counter)."""
    from pdfleet.connector.router.app import ROUTER_KEY, start_router
    from pdfleet.connector.serving.endpoints import Endpoint, RevisionEndpoints
    from pdfleet.contract import metrics as names
    from pdfleet.contract.router_config import RouterConfig
    from pdfleet.contract.routing import LEAST_OUTSTANDING

    (a, (pa, da)), (b, (pb, db)) = pairs.items()
    groups = [RevisionEndpoints(a, (Endpoint(pa),), (Endpoint(da),), created=1, serving=True),
              RevisionEndpoints(b, (Endpoint(pb),), (Endpoint(db),), created=2, canary_weight=weight)]

    async def discovery(router) -> None:
        router.set_endpoints(groups)
        await asyncio.Event().wait()

    config = RouterConfig(prefill=tuple(dict.fromkeys((pa, pb))), decode=tuple(dict.fromkeys((da, db))),
                          prefill_policy=LEAST_OUTSTANDING, decode_policy=LEAST_OUTSTANDING)
    runner, port = await start_router(config, "127.0.0.1", 0, discovery=discovery)
    try:
        answers = await ask_all(f"http://127.0.0.1:{port}", reqs, concurrency=4)
        registry = runner.app[ROUTER_KEY].metrics.registry
        served = {rev: registry.get_sample_value(f"{names.ROUTER_REVISION_REQUESTS}_total",
                                                 {"revision": rev, names.REVISION_OUTCOME: names.OUTCOME_ANSWERED})
                  or 0.0 for rev in pairs}
    finally:
        await runner.cleanup()
    return answers, served


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the series ``name`` whose labels include ``labels`` (lines that do not parse skipped)."""
    return metrics_text.total(metrics_text.lenient_samples(text)[0], name, **labels)


def transferred_tokens(decode_url: str) -> float:
    text = httpx.get(decode_url + "/metrics", timeout=10).text
    return metric_sum(text, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")


# --- prompt sets ---------------------------------------------------------------------


@dataclass
class PromptSets:
    identity: list[Req]
    concurrent: list[Req]
    kill: list[Req]
    after_restart: list[Req]
    # test_local_two_prefills.py: {policy: (first turns, later turns)}, answered by the same reference server
    prefix_workload: dict[str, tuple[list[Req], list[Req]]] = field(default_factory=dict)
    # test_local_kv_offload.py: (first turns, second turns) of conversations longer than the fleet's KV memory
    kv_tier: tuple[list[Req], list[Req]] = field(default_factory=lambda: ([], []))
    all: list[Req] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.all = self.identity + self.concurrent + self.kill + self.after_restart + self.kv_tier[0] + self.kv_tier[1]
        for first, later in self.prefix_workload.values():
            self.all += first + later


def corpus_ids(model_dir: Path, n: int) -> list[int]:
    from transformers import AutoTokenizer

    from pdfleet.operator.local.tiny_model import build_corpus

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids: list[int] = []
    for line in build_corpus(seed=7, sentences=4000):
        ids += tok(" " + line, add_special_tokens=False).input_ids
        if len(ids) >= n:
            return ids[:n]
    raise AssertionError("corpus too short")


def prompt_sets(model_dir: Path) -> PromptSets:
    ids = corpus_ids(model_dir, 30000)
    identity: list[Req] = []
    # Token-id prompts of exact lengths around block boundaries (block size 32).
    for k, n in enumerate([5, 17, 31, 32, 33, 63, 64, 65, 100, 200, 500, 1000]):
        identity.append(completion(f"{n} tokens", ids[k * 1000:k * 1000 + n]))
    identity += [completion("text: river", "The river runs"), completion("text: one word", "Winter")]
    prefix = ids[15000:15070]  # over two blocks, shared by the next four
    for k, n in enumerate([1, 5, 26, 40]):
        identity.append(completion(f"shared prefix + {n}", prefix + ids[16000 + 100 * k:16000 + 100 * k + n]))
    identity += [
        chat("chat: short", "Which engine holds the cache?"),
        chat("chat: long", " ".join(["the decode pod reads every block of the prompt from prefill"] * 12)),
        chat("chat: shared opening", "Which engine holds the cache? And how many blocks move?"),
    ]
    identity += [
        completion("stream: short", "Prefill then decode", stream=True),
        completion("stream: 150 tokens", ids[17000:17150], stream=True),
        chat("stream: chat", "Stream the answer block by block, please.", stream=True),
    ]
    concurrent = [completion(f"concurrent {i}", ids[18000 + 150 * i:18000 + 150 * i + 20 + 9 * i], max_tokens=16)
                  for i in range(32)]
    kill = [completion(f"kill {i}", ids[24000 + 100 * i:24000 + 100 * i + 40 + 7 * i], max_tokens=32)
            for i in range(40)]
    after_restart = [completion("after restart", ids[29000:29300], max_tokens=16)]
    return PromptSets(identity, concurrent, kill, after_restart, prefix_workload(), kv_tier_workload(model_dir))


PREFIX_SYSTEM_PROMPTS = 4
PREFIX_LATER_TURNS = 3


def prefix_workload() -> dict[str, tuple[list[Req], list[Req]]]:
    """Per routing policy, its own system prompts (a few hundred tokens each): one first turn each,
    then later user turns on every one of them (sent concurrently by the test)."""
    from pdfleet.operator.local.tiny_model import build_corpus

    lines = build_corpus(seed=23, sentences=3000)
    out = {}
    for p, policy in enumerate(("prefixAware", "leastOutstanding")):
        first: list[Req] = []
        later: list[Req] = []
        for s in range(PREFIX_SYSTEM_PROMPTS):
            base = 1000 * p + 200 * s
            system = f"System prompt {policy} {s}. " + " ".join(lines[base:base + 16]) + "\n\nUser: "
            for t in range(PREFIX_LATER_TURNS + 1):
                turn = " ".join(lines[base + 100 + 3 * t:base + 103 + 3 * t])
                req = completion(f"prefix {policy} s{s} t{t}", system + turn, max_tokens=4)
                (first if t == 0 else later).append(req)
        out[policy] = (first, later)
    return out


KV_TIER_CONVERSATIONS = 8  # spread over two decodes: four each
KV_TIER_FIRST_TURN_TOKENS = 560  # ~18 blocks of 32: four first turns outgrow a 48-block KV cache


def kv_tier_workload(model_dir: Path) -> tuple[list[Req], list[Req]]:
    """Conversations whose first turns together outgrow the KV memory of test_local_kv_offload.py's engines:
    a first turn of about KV_TIER_FIRST_TURN_TOKENS tokens each, then a second turn that repeats it and adds a
    short user message (text prompts: the router hashes them with the model's tokenizer)."""
    from transformers import AutoTokenizer

    from pdfleet.operator.local.tiny_model import build_corpus

    tok = AutoTokenizer.from_pretrained(model_dir)
    lines = iter(build_corpus(seed=41, sentences=3000))
    first: list[Req] = []
    second: list[Req] = []
    for c in range(KV_TIER_CONVERSATIONS):
        text = f"Conversation {c}."
        while len(tok(text).input_ids) < KV_TIER_FIRST_TURN_TOKENS:
            text += " " + next(lines)
        more = " ".join(next(lines) for _ in range(3))
        first.append(completion(f"kv tier c{c} t1", text, max_tokens=8))
        second.append(completion(f"kv tier c{c} t2", f"{text}\n\nUser: {more}", max_tokens=8))
    return first, second


# --- processes ------------------------------------------------------------------------


def cpu_list() -> list[int]:
    return sorted(os.sched_getaffinity(0))


@contextmanager
def reference_server(workdir: Path, model_dir: Path) -> Iterator[str]:
    """A single vLLM server without KV transfer: the same command as prefill's minus the
    connector, pinned like one fleet engine (same thread count, so the same numerics)."""
    spec = tiny_spec()
    port = reserve_ports(1)[0]
    args = vllm_args(spec, "prefill", "reference", model=str(model_dir), host="127.0.0.1", port=port)
    for flag in ("--kv-transfer-config", "--kv-events-config"):  # a plain server: no P/D, no event port
        k = args.index(flag)
        args = args[:k] + args[k + 2:]
    env = {"VLLM_CPU_OMP_THREADS_BIND": str(cpu_list()[0]), "VLLM_CPU_KVCACHE_SPACE": "1"}
    log = workdir / "reference.log"
    child = start_child("reference", [sys.executable, "-m", ENGINE_MODULE, *args], env, log, cwd=workdir)
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(url, alive=child.alive, timeout=STARTUP_TIMEOUT_S)
        except NotHealthy as exc:
            raise AssertionError(f"reference server {exc}:\n{log.read_text()[-3000:]}") from None
        yield url
    finally:
        stop_groups([child.pgid], [child.proc])


class Fleet:
    """`pdfleet local` running as a subprocess (the real CLI)."""

    def __init__(self, workdir: Path, cr: Path = TINY_CR, env: Optional[dict[str, str]] = None,
                 extra_args: tuple[str, ...] = ()) -> None:
        self.workdir = workdir
        self.state_file = workdir / "state.json"
        self.run_dir = workdir / "run"
        self.stdout: "queue.Queue[str]" = queue.Queue()
        self.stdout_lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pdfleet.operator.cli", "local", "-f", str(cr),
             "--state-file", str(self.state_file), "--run-dir", str(self.run_dir),
             "--startup-timeout", str(STARTUP_TIMEOUT_S), *extra_args],
            cwd=workdir, env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE, stderr=open(workdir / "runner.stderr", "wb"), text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()
        self.router: Optional[str] = None

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.stdout.put(line.rstrip("\n"))

    def next_line(self, timeout: float) -> Optional[str]:
        try:
            line = self.stdout.get(timeout=timeout)
        except queue.Empty:
            return None
        self.stdout_lines.append(line)
        return line

    def wait_router(self, timeout: float = STARTUP_TIMEOUT_S + 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.next_line(1.0)
            if line is not None and line.startswith("router: http"):  # the URL line only
                self.router = line[len("router: "):]
                return self.router
            if line is None and self.proc.poll() is not None:
                break
        raise AssertionError(f"no router line; runner stderr:\n{self.stderr()[-4000:]}")

    def stderr(self) -> str:
        return (self.workdir / "runner.stderr").read_text(errors="replace")

    def state(self) -> dict[str, Any]:
        return json.loads(self.state_file.read_text())

    def engine(self, role: str) -> dict[str, Any]:
        return next(e for e in self.state()["engines"] if e["role"] == role)

    def terminate(self, timeout: float = 90.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@contextmanager
def local_fleet(workdir: Path, **kwargs: Any) -> Iterator[Fleet]:
    workdir.mkdir(parents=True, exist_ok=True)
    fleet = Fleet(workdir, **kwargs)
    try:
        fleet.wait_router()
        yield fleet
    finally:
        fleet.terminate()
        # Whatever the runner left (it should leave nothing; a test checks), never leak engines.
        try:
            groups = [e["pgid"] for e in fleet.state()["engines"]]
        except (OSError, ValueError, KeyError):
            groups = []
        stop_groups(groups, grace_s=5)


def model_dir() -> Path:
    return ensure_tiny_model()
