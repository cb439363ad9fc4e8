"""Conditional disaggregation (issue 32): one mixed workload against Always, Conditional, decode alone for
every request, and one plain server, measured in the same run.

    flock /tmp/pdfleet-heavy.lock .venv/bin/python bench/disaggregation.py [--requests 64] [--concurrency 6]

The workload: half short prompts (under one 32-token block), half long ones (1,000-2,000 tokens) that open
with one of a few shared system prompts; streamed, a few at a time, short and long interleaved. The plain
server (one vLLM, pinned to one CPU like a fleet engine) runs first and alone; then one `pdfleet local`
fleet (examples/tiny-cpu.yaml: 1 prefill + 1 decode) and, on its engines, routers of this process that
differ only in their disaggregation settings: Always, Conditional (one row per --min-remote-prefill-tokens
value), and decode alone (Conditional with a minimum no prompt reaches). Each row sends the same prompts with its own cache_salt, so no row finds another's prefixes
cached (a row's own shared system prompts are cached as they would be in service). Rows: requests/min
over the whole run, TTFT p50/p99 per prompt class, and the decisions the router counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import httpx
import yaml

from pdfleet.contract.metrics import ROUTER_DISAGGREGATION_DECISIONS
from pdfleet.contract.routing import DISAGGREGATION_ALWAYS, DISAGGREGATION_CONDITIONAL
from pdfleet.operator.api import parse
from pdfleet.operator.local import health
from pdfleet.operator.local.fleet import kv_events_endpoints
from pdfleet.operator.local.processes import reserve_ports, start_child, stop_groups
from pdfleet.operator.local.tiny_model import build_corpus, ensure_tiny_model
from pdfleet.operator.plan.engine import ENGINE_MODULE, served_model_name, vllm_args

REPO = Path(__file__).resolve().parents[1]
CR = REPO / "examples" / "tiny-cpu.yaml"
SHORT, LONG = "short", "long"
DECODE_ALONE = "decode alone"  # the row whose router serves every request from decode
NEVER = 1_000_000  # a minimum of remote-prefill tokens that no prompt reaches: decode alone for every request


def corpus_ids(model_dir: Path, n: int) -> list[int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids: list[int] = []
    for line in build_corpus(seed=17, sentences=40000):
        ids += tok(" " + line, add_special_tokens=False).input_ids
        if len(ids) >= n:
            return ids[:n]
    raise SystemExit("corpus too short")


def workload(model_dir: Path, requests: int, systems: int, seed: int = 5) -> list[tuple[str, list[int]]]:
    """(class, token ids), short and long interleaved."""
    rng = random.Random(seed)
    ids = corpus_ids(model_dir, 2_000 * (requests // 2 + systems) + 40 * requests)
    pos = 0

    def take(n: int) -> list[int]:
        nonlocal pos
        pos += n
        return ids[pos - n:pos]

    system_prompts = [take(rng.randint(700, 900)) for _ in range(systems)]
    out = []
    for i in range(requests // 2):
        out.append((SHORT, take(rng.randint(4, 28))))
        system = system_prompts[i % systems]
        out.append((LONG, system + take(rng.randint(1_000, 2_000) - len(system))))
    return out


async def one(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], salt: str,
              max_tokens: int) -> float:
    """Seconds to the first token of one streamed completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "cache_salt": salt}
    started = time.perf_counter()
    ttft, chunks = None, 0
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            for choice in json.loads(line[5:]).get("choices") or []:
                if choice.get("text") is not None and ttft is None:
                    ttft = time.perf_counter() - started
                chunks += 1
    assert ttft is not None and chunks >= 1, (ttft, chunks)
    return ttft


async def measure(url: str, model: str, work: list[tuple[str, list[int]]], salt: str, max_tokens: int,
                  concurrency: int) -> dict:
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        for _kind, prompt in work[:4]:  # warm-up on a salt of its own (first handshake, first compile paths)
            await one(client, url, model, prompt, salt + "-warm", 4)
        sem = asyncio.Semaphore(concurrency)

        async def limited(kind: str, prompt: list[int]) -> tuple[str, float]:
            async with sem:
                return kind, await one(client, url, model, prompt, salt, max_tokens)

        started = time.perf_counter()
        results = await asyncio.gather(*(limited(k, p) for k, p in work))
        wall = time.perf_counter() - started
    out: dict = {"requests_per_min": len(results) / wall * 60, "wall_s": wall}
    for kind in (SHORT, LONG):
        ttfts = sorted(t for k, t in results if k == kind)
        out[kind] = (statistics.median(ttfts) * 1e3, ttfts[min(len(ttfts) - 1, round(0.99 * (len(ttfts) - 1)))] * 1e3)
    return out


def plain_server(work: Path, model_dir: Path, run) -> dict:
    spec = parse(yaml.safe_load(CR.read_text())).spec
    port = reserve_ports(1)[0]
    args = vllm_args(spec, "prefill", "plain", model=str(model_dir), host="127.0.0.1", port=port)
    for flag in ("--kv-transfer-config", "--kv-events-config"):  # a plain server: no P/D, no event port
        k = args.index(flag)
        args = args[:k] + args[k + 2:]
    cpu = sorted(os.sched_getaffinity(0))[0]
    child = start_child("plain", [sys.executable, "-m", ENGINE_MODULE, *args],
                        {"VLLM_CPU_OMP_THREADS_BIND": str(cpu), "VLLM_CPU_KVCACHE_SPACE": "1"},
                        work / "plain.log", cwd=work)
    try:
        url = f"http://127.0.0.1:{port}"
        health.wait_healthy(url, alive=child.alive, timeout=600)
        return run(url)
    finally:
        stop_groups([child.pgid], [child.proc])


async def through_routers(state: dict, run_dir: Path, model_dir: Path, policies: dict, measure_one) -> dict:
    from pdfleet.connector.router.app import ROUTER_KEY, start_router
    from pdfleet.contract.router_config import RouterConfig

    engines = state["engines"]
    spec = parse(yaml.safe_load(CR.read_text())).spec
    base = RouterConfig(
        prefill=tuple(e["url"] for e in engines if e["role"] == "prefill"),
        decode=tuple(e["url"] for e in engines if e["role"] == "decode"),
        kv_events=tuple((e["url"], ",".join(kv_events_endpoints(str(run_dir.resolve()), e["name"])))
                        for e in engines if e.get("kv_events")),
        tokenizer=str(model_dir), block_size=spec.engine.block_size)
    out = {}
    for name, settings in policies.items():
        runner, port = await start_router(replace(base, **settings), "127.0.0.1", 0)
        try:
            await runner.app[ROUTER_KEY].picker.prefix.wait_ready()
            url = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(timeout=10) as client:
                deadline = time.monotonic() + 30
                while not all(s["synced"] for s in (await client.get(url + "/health")).json()["prefix_routing"]
                              ["streams"].values()):
                    if time.monotonic() > deadline:
                        raise SystemExit("the router's KV event streams did not sync")
                    await asyncio.sleep(0.1)
            out[name] = await measure_one(url, name)
            async with httpx.AsyncClient(timeout=10) as client:
                text = (await client.get(url + "/metrics")).text
            out[name]["decisions"] = {line.split("{", 1)[1].split("}", 1)[0].replace('"', ""):
                                      int(float(line.rsplit(" ", 1)[1])) for line in text.splitlines()
                                      if line.startswith(ROUTER_DISAGGREGATION_DECISIONS + "_total{")}
        finally:
            await runner.cleanup()
    return out


def fleet(work: Path, model_dir: Path, policies: dict, measure_one) -> dict:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdfleet.operator.cli", "local", "-f", str(CR), "--run-dir", str(work / "fleet"),
         "--state-file", str(work / "state.json")],
        cwd=work, stdout=subprocess.PIPE, stderr=open(work / "fleet.stderr", "wb"), text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("router: "):
                state = json.loads((work / "state.json").read_text())
                return asyncio.run(through_routers(state, work / "fleet", model_dir, policies, measure_one))
        raise SystemExit(f"pdfleet local ended without a router line:\n{(work / 'fleet.stderr').read_text()[-3000:]}")
    finally:
        proc.terminate()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64, help="half short, half long")
    parser.add_argument("--concurrency", type=int, default=6)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--systems", type=int, default=4, help="shared system prompts of the long requests")
    parser.add_argument("--min-remote-prefill-tokens", type=int, nargs="+", default=[128],
                        help="Conditional's minimum; several: one Conditional row each")
    args = parser.parse_args()

    model_dir = ensure_tiny_model()
    model = served_model_name(parse(yaml.safe_load(CR.read_text())).spec)
    work_items = workload(model_dir, args.requests, args.systems)

    def measure_one(url: str, salt: str):
        return measure(url, model, work_items, salt, args.max_tokens, args.concurrency)

    policies = {
        DISAGGREGATION_ALWAYS: {"disaggregation_policy": DISAGGREGATION_ALWAYS},
        **{f"{DISAGGREGATION_CONDITIONAL} {m}": {"disaggregation_policy": DISAGGREGATION_CONDITIONAL,
                                                  "min_remote_prefill_tokens": m}
           for m in args.min_remote_prefill_tokens},
        DECODE_ALONE: {"disaggregation_policy": DISAGGREGATION_CONDITIONAL, "min_remote_prefill_tokens": NEVER},
    }
    with tempfile.TemporaryDirectory(prefix="disagg-bench-") as tmp:
        work = Path(tmp)
        rows = {"plain server": plain_server(work, model_dir, lambda url: asyncio.run(measure_one(url, "plain")))}
        rows.update(fleet(work, model_dir, policies, measure_one))

    lengths = {k: [len(p) for kind, p in work_items if kind == k] for k in (SHORT, LONG)}
    print(f"tiny model, 1 prefill + 1 decode (examples/tiny-cpu.yaml); {len(work_items)} streamed requests, "
          f"concurrency {args.concurrency}, {args.max_tokens} new tokens; short prompts {min(lengths[SHORT])}-"
          f"{max(lengths[SHORT])} tokens, long {min(lengths[LONG])}-{max(lengths[LONG])} tokens on "
          f"{args.systems} shared system prompts; "
          f"CPUs {sorted(os.sched_getaffinity(0))}")
    print(f"{'':18}{'req/min':>9}{'short p50':>11}{'short p99':>11}{'long p50':>10}{'long p99':>10}  decisions")
    for name, r in rows.items():
        print(f"{name:18}{r['requests_per_min']:9.1f}{r[SHORT][0]:11.1f}{r[SHORT][1]:11.1f}{r[LONG][0]:10.1f}"
              f"{r[LONG][1]:10.1f}  {r.get('decisions', '')}")
    a, d = rows[DISAGGREGATION_ALWAYS], rows[DECODE_ALONE]
    for m in args.min_remote_prefill_tokens:
        name = f"{DISAGGREGATION_CONDITIONAL} {m}"
        c = rows[name]
        goals = [
            ("short TTFT p50 <= 1.1x decode alone's", c[SHORT][0] / d[SHORT][0], 1.1),
            ("long TTFT p50 <= 1.05x Always'", c[LONG][0] / a[LONG][0], 1.05),
            ("req/min >= the better of Always and decode alone", max(a["requests_per_min"], d["requests_per_min"])
             / c["requests_per_min"], 1.0),
        ]
        for label, ratio, bound in goals:
            print(f"{name}: {label}: ratio {ratio:.2f} (goal <= {bound}) {'met' if ratio <= bound else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
