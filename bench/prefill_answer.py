"""The prefill leg against a client-sized answer (issue 38, part 3): the leg as it was vs as it is, in one run.

    flock /tmp/pdfleet-cpu.lock .venv/bin/python bench/prefill_answer.py [--tokens 32768] [--top 20] [--requests 5]

A fake prefill in its own process answers as vLLM does: a request with ``prompt_logprobs: K`` gets K
candidates for each prompt token (a 32k-token prompt at 20: ~50 MB of JSON), any other a ~1 KB answer,
both with kv_transfer_params; a fake decode (its own process too) answers a small completion. The router
runs in this process, on its own event loop, in front of them. A 1 ms ticker on the router's loop records
the loop's longest stall and the process's peak RSS while each request runs (the ticker cannot sample
inside a stall, so RSS misses objects built and freed within one); a last pass per leg, under
tracemalloc, gives the peak of Python allocations during one request, which does not miss them.

  old: the leg before issue 38 part 3 (the client's prompt_logprobs sent to prefill, the whole answer read
       and decoded on the loop to use kv_transfer_params);
  new: the leg as landed (prefill_leg.py: answer-only fields dropped, the answer bounded and read for one
       field).
Each request's client body is the same: ``{"prompt": [<tokens> ids], "max_tokens": 8, "prompt_logprobs": K}``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import tracemalloc
from contextlib import contextmanager, nullcontext

import aiohttp
import msgspec
from aiohttp import web

from pdfleet.connector.router.app import start_router
from pdfleet.connector.serving import prefill_leg
from pdfleet.contract.kv_params import produce
from pdfleet.contract.ports import SIDE_CHANNEL
from pdfleet.contract.router_config import RouterConfig

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


# --- the fake engines (their own processes) -------------------------------------------------------------

def prompt_logprobs(tokens: int, top: int) -> list:
    entry = {str(1000 + r): {"logprob": -1.2345678901234567, "rank": r + 1, "decoded_token": " token"}
             for r in range(top)}
    return [None] + [entry] * (tokens - 1)


def engine(role: str, port: int) -> None:
    cache: dict[tuple[int, int], bytes] = {}

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        answer = {"id": "cmpl", "object": "text_completion", "model": body.get("model"),
                  "choices": [{"index": 0, "text": "x", "finish_reason": "length"}]}
        if role == "prefill":
            answer["kv_transfer_params"] = produce(
                block_ids=[1, 2, 3], engine_id="p0", request_id=request.headers.get("X-Request-Id") or "",
                host="127.0.0.1", port=SIDE_CHANNEL, tp_size=1, instance_id=None, lease_seconds=30, num_tokens=48)
            top = int(body.get("prompt_logprobs") or 0)
            if top:  # serialized once per size: the bench measures the router, not this fake
                key = (len(body["prompt"]), top)
                if key not in cache:
                    cache[key] = json.dumps(prompt_logprobs(*key)).encode()
                head = json.dumps(answer).encode()[:-1]
                return web.Response(body=head + b', "prompt_logprobs": ' + cache[key] + b"}",
                                    content_type="application/json")
        return web.json_response(answer)

    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/v1/completions", generate)
    web.run_app(app, host="127.0.0.1", port=port, print=None, access_log=None)


# --- the router's two legs --------------------------------------------------------------------------------

def _old_one_token_body(body, kv_transfer_params, *, chat):
    out = dict(body, max_tokens=1, stream=False, kv_transfer_params=kv_transfer_params)
    if chat:
        out["max_completion_tokens"] = 1
    out.pop("stream_options", None)
    out.pop("min_tokens", None)
    return out


@contextmanager
def old_leg():
    """prefill_leg.py before: the whole body sent, the whole answer read and decoded."""
    saved = prefill_leg.one_token_body, prefill_leg.MAX_PREFILL_ANSWER_BYTES, prefill_leg.answer_kv_params
    prefill_leg.one_token_body = _old_one_token_body
    prefill_leg.MAX_PREFILL_ANSWER_BYTES = 1 << 40
    prefill_leg.answer_kv_params = lambda data: msgspec.json.decode(data).get("kv_transfer_params")
    try:
        yield
    finally:
        prefill_leg.one_token_body, prefill_leg.MAX_PREFILL_ANSWER_BYTES, prefill_leg.answer_kv_params = saved


class Ticker:
    """The loop's longest gap between 1 ms ticks and the peak RSS, since the last reset."""

    def __init__(self) -> None:
        self.stall = 0.0
        self.peak = 0
        self._task: asyncio.Task | None = None

    def reset(self) -> None:
        self.stall, self.peak = 0.0, rss()

    async def _run(self) -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            self.stall = max(self.stall, now - last - 0.001)
            self.peak = max(self.peak, rss())
            last = now

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())


async def one(session, url, body, ticker: Ticker) -> tuple[float, float, float, int]:
    base = rss()
    ticker.reset()
    t0 = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body) as resp:
        await resp.read()
        status = resp.status
    return time.perf_counter() - t0, ticker.stall, (ticker.peak - base) / 2**20, status


async def measure(args, prefill: str, decode: str, peaks: dict[str, float]) -> dict[str, list[tuple]]:
    config = RouterConfig(prefill=(prefill,), decode=(decode,), prefill_timeout_s=120.0,
                          decode_first_byte_timeout_s=120.0, decode_idle_timeout_s=120.0)
    runner, port = await start_router(config, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{port}"
    body = {"model": "tiny", "prompt": list(range(args.tokens)), "max_tokens": 8, "prompt_logprobs": args.top}
    ticker = Ticker()
    ticker.start()
    rows: dict[str, list[tuple]] = {"old": [], "new": []}
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            with old_leg():  # warm the fake's cache and the connections
                await one(session, url, body, ticker)
            for _ in range(args.requests):  # interleaved: old, new, old, new...
                with old_leg():
                    rows["old"].append(await one(session, url, body, ticker))
                rows["new"].append(await one(session, url, body, ticker))
            tracemalloc.start()
            for leg in ("old", "new"):
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
                with old_leg() if leg == "old" else nullcontext():
                    await one(session, url, body, ticker)
                peaks[leg] = (tracemalloc.get_traced_memory()[1] - base) / 2**20
            tracemalloc.stop()
    finally:
        await runner.cleanup()
    return rows


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_up(url: str) -> None:
    async with aiohttp.ClientSession() as session:
        for _ in range(200):
            try:
                async with session.post(url + "/v1/completions", json={"prompt": [1]}) as resp:
                    if resp.status == 200:
                        return
            except aiohttp.ClientError:
                pass
            await asyncio.sleep(0.05)
    raise SystemExit(f"engine at {url} did not start")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--requests", type=int, default=5)
    ap.add_argument("--engine", choices=["prefill", "decode"], help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine:
        return engine(args.engine, args.port)
    ports = free_port(), free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--engine", role, "--port", str(port)])
             for role, port in zip(("prefill", "decode"), ports)]
    try:
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        for u in urls:
            asyncio.run(wait_up(u))
        peaks: dict[str, float] = {}
        rows = asyncio.run(measure(args, *urls, peaks))
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=10)
    print(f"prompt {args.tokens} tokens, prompt_logprobs {args.top}; {args.requests} requests each, interleaved")
    print(f"{'leg':4} {'status':>7} {'latency s (median)':>19} {'loop stall ms (median/max)':>27} "
          f"{'RSS growth MiB (median/max)':>28} {'traced peak MiB':>16}")
    for leg, rs in rows.items():
        lat, stall, mem, status = zip(*rs)
        print(f"{leg:4} {','.join(sorted({str(s) for s in status})):>7} {statistics.median(lat):>19.3f} "
              f"{statistics.median(stall) * 1e3:>14.1f} / {max(stall) * 1e3:>9.1f} "
              f"{statistics.median(mem):>15.1f} / {max(mem):>9.1f} {peaks[leg]:>16.1f}")


if __name__ == "__main__":
    main()
