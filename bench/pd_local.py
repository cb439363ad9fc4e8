"""Time to first token and throughput: 1 prefill + 1 decode through the router (`pdfleet local`)
against a single vLLM server, both on the built-in tiny model, measured in the same run.

    flock /tmp/pdfleet-cpu.lock .venv/bin/python bench/pd_local.py [--prompt-tokens 512] [--requests 32]

The single server runs first and alone, pinned to one CPU like each fleet engine; then the
fleet starts. On CPU there is no goal: the figures show what P/D costs or saves here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from pdfleet.operator.api import parse
from pdfleet.operator.local import health
from pdfleet.operator.local.processes import reserve_ports, start_child, stop_groups
from pdfleet.operator.local.tiny_model import build_corpus, ensure_tiny_model
from pdfleet.operator.plan.engine import ENGINE_MODULE, served_model_name, vllm_args

REPO = Path(__file__).resolve().parents[1]
CR = REPO / "examples" / "tiny-cpu.yaml"


def prompts(model_dir: Path, n: int, length: int) -> list[list[int]]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids: list[int] = []
    for line in build_corpus(seed=11, sentences=20000):
        ids += tok(" " + line, add_special_tokens=False).input_ids
        if len(ids) >= n * length:
            break
    # Distinct prompts: no prefix cache hits between them.
    return [ids[k * length:(k + 1) * length] for k in range(n)]


async def one(client: httpx.AsyncClient, url: str, model: str, prompt: list[int], max_tokens: int) -> tuple[float, int]:
    """(seconds to the first token, tokens generated) of one streaming completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    started = time.perf_counter()
    ttft, tokens = None, 0
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if not line.startswith("data:") or line.endswith("[DONE]"):
                continue
            chunk = json.loads(line[5:])
            for choice in chunk.get("choices") or []:
                n = len(choice.get("token_ids") or [])
                if n and ttft is None:
                    ttft = time.perf_counter() - started
                tokens += n
    assert ttft is not None and tokens == max_tokens, (ttft, tokens)
    return ttft, tokens


async def measure(url: str, model: str, ttft_prompts, load_prompts, max_tokens: int, concurrency: int) -> dict:
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        await one(client, url, model, ttft_prompts[0], 4)  # warm-up (first handshake, first compile paths)
        ttfts = [(await one(client, url, model, p, max_tokens))[0] for p in ttft_prompts[1:]]
        sem = asyncio.Semaphore(concurrency)

        async def limited(p):
            async with sem:
                return await one(client, url, model, p, max_tokens)

        started = time.perf_counter()
        results = await asyncio.gather(*(limited(p) for p in load_prompts))
        wall = time.perf_counter() - started
    return {
        "ttft_p50_ms": statistics.median(ttfts) * 1e3,
        "ttft_mean_ms": statistics.fmean(ttfts) * 1e3,
        "loaded_ttft_p50_ms": statistics.median(r[0] for r in results) * 1e3,
        "throughput_tok_s": sum(r[1] for r in results) / wall,
        "requests_per_s": len(results) / wall,
        "wall_s": wall,
    }


def wait_healthy(url: str, proc_alive, timeout: float = 600) -> None:
    try:
        health.wait_healthy(url, alive=proc_alive, timeout=timeout)
    except health.NotHealthy as exc:
        raise SystemExit(f"server {exc}") from None


def single_server(work: Path, model_dir: Path, run) -> dict:
    spec = parse(yaml.safe_load(CR.read_text())).spec
    port = reserve_ports(1)[0]
    args = vllm_args(spec, "prefill", "single", model=str(model_dir), host="127.0.0.1", port=port)
    for flag in ("--kv-transfer-config", "--kv-events-config"):  # a plain server: no P/D, no event port
        k = args.index(flag)
        args = args[:k] + args[k + 2:]
    cpu = sorted(os.sched_getaffinity(0))[0]
    child = start_child("single", [sys.executable, "-m", ENGINE_MODULE, *args],
                        {"VLLM_CPU_OMP_THREADS_BIND": str(cpu), "VLLM_CPU_KVCACHE_SPACE": "1"},
                        work / "single.log", cwd=work)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(url, child.alive)
        return run(url)
    finally:
        stop_groups([child.pgid], [child.proc])


def fleet(work: Path, run) -> dict:
    proc = subprocess.Popen(
        [sys.executable, "-m", "pdfleet.operator.cli", "local", "-f", str(CR), "--run-dir", str(work / "fleet"),
         "--state-file", str(work / "state.json")],
        cwd=work, stdout=subprocess.PIPE, stderr=open(work / "fleet.stderr", "wb"), text=True,
    )
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.startswith("router: "):
                return run(line.split(" ", 1)[1].strip())
        raise SystemExit(f"pdfleet local ended without a router line:\n{(work / 'fleet.stderr').read_text()[-3000:]}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--ttft-requests", type=int, default=10)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()

    model_dir = ensure_tiny_model()
    model = served_model_name(parse(yaml.safe_load(CR.read_text())).spec)
    ps = prompts(model_dir, 2 * (args.ttft_requests + 1 + args.requests), args.prompt_tokens)
    half = len(ps) // 2

    def runner(offset: int):
        chosen = ps[offset:offset + half]
        ttft, load = chosen[:args.ttft_requests + 1], chosen[args.ttft_requests + 1:]
        return lambda url: asyncio.run(measure(url, model, ttft, load, args.max_tokens, args.concurrency))

    with tempfile.TemporaryDirectory(prefix="pd-bench-") as tmp:
        work = Path(tmp)
        single = single_server(work, model_dir, runner(0))
        pd = fleet(work, runner(half))

    print(f"tiny model, prompt {args.prompt_tokens} tokens, {args.max_tokens} new tokens; "
          f"TTFT: {args.ttft_requests} sequential requests; throughput: {args.requests} requests, "
          f"concurrency {args.concurrency}; CPUs {sorted(os.sched_getaffinity(0))}")
    print(f"{'':26}{'single (1 CPU)':>16}{'1P1D router':>16}{'P/D / single':>14}")
    for key, label in [("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_mean_ms", "TTFT mean (ms)"),
                       ("loaded_ttft_p50_ms", "TTFT p50 under load (ms)"),
                       ("throughput_tok_s", "throughput (tokens/s)"), ("requests_per_s", "requests/s")]:
        print(f"{label:26}{single[key]:16.1f}{pd[key]:16.1f}{pd[key] / single[key]:14.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
