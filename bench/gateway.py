"""The gateway path against the router path on one fresh 2 prefill + 1 decode `pdfleet local` fleet, in
one run (issue 29).

    flock /tmp/pdfleet-heavy.lock .venv/bin/python bench/gateway.py [--rounds 2]
    flock /tmp/pdfleet-cpu.lock .venv/bin/python bench/gateway.py --fakes 2000   # light: fake engines

Paths: (router) the fleet's own router, inside `pdfleet local`; (gateway) a real Envoy (GAIE's shape,
BUFFERED; connector/epp/envoy/) in front of `pdfleet epp` run as its own process, which runs the
prefill leg itself and routes to decode with the params. Both prefix-aware on both legs, from the
engines' KV events and the model's tokenizer. Rounds alternate router, gateway, router, gateway, ...
on the same fleet, each with a cache_salt of its own (no round finds another's prefixes cached).

Workload: bench/local_throughput.py's shared-prefix workload (32 completions over 8 system prompts,
max_tokens 8, temperature 0), streamed, from 4 concurrent clients.

Per path: requests/min, TTFT p50/p99 (send to the first streamed token at the client), failures and
fallbacks. The EPP: its decision time p50/p99 (pdfleet_epp_decision_seconds: choose_pair, decide and
every pick of a request, prefill's prefix-aware pick included; quantiles interpolated inside the
histogram's buckets), and CPU seconds per request of the `pdfleet epp` process and of Envoy (psutil);
for scale, the `pdfleet local` process's CPU per request on the router path (its router and its
supervision, so an upper bound of the router's).

--decision R: no fleet, no processes: the EPP's decision core (picker.py) in this process, R rounds of
the same workload (each its own cache_salt), timed as the EPP times it (choose_pair, decide, prefill's
pick, decode's pick); each engine's KV index holds, as its events would say, every block of the prompts
it was given. Prefix-aware scoring with the model's tokenizer against the least-outstanding baseline,
in one run: the EPP's own decision cost without the engines' competition for the CPU.

On a fleet, --replay R (default 10; 0: off) runs that replay twice in the same run, as a control for
what the machine does to the EPP's figure: once before the fleet starts (quiet), and once as its own
process while gateway rounds keep the fleet busy (loaded; those rounds are not counted above), plus
once quiet with the CPU caches evicted before each request (--cold: 64 MiB written), as the engines
and the EPP's own I/O evict them between requests on the fleet. The same code, timed the same way:
the ratios say what competition for the cores and cold caches each cost the decision.

--fakes N: no fleet; fake engines in this process, `pdfleet router` and `pdfleet epp` (+ Envoy) as
processes on them, prefix-aware with the tiny model's tokenizer (scoring from what each routed), N
non-streamed requests each at --concurrency: requests/s, latency, CPU per request of the router
process vs the EPP process (and Envoy), the EPP's decision time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e" / "local"))
sys.path.insert(0, str(REPO / "bench"))

from local_fleet import BLOCK, TINY_CR, local_fleet, model_dir, tiny_spec  # noqa: E402
from local_throughput import workload  # noqa: E402

from pdfleet.connector.epp.envoy_config import BUFFERED, message_timeout_for, render  # noqa: E402
from pdfleet.connector.epp.envoy_process import Envoy, free_port  # noqa: E402
from pdfleet.contract.env import EPP_CALLER_TOKEN  # noqa: E402
from pdfleet.contract.metrics import EPP_DECISION  # noqa: E402
from pdfleet.contract.routing import FALLBACK_HEADER, PREFIX_AWARE  # noqa: E402
from pdfleet.contract.router_config import RouterConfig  # noqa: E402
from pdfleet.operator.local.fleet import kv_events_endpoints  # noqa: E402
from pdfleet.operator.observability import metrics_text  # noqa: E402
from pdfleet.operator.plan.engine import hash_seed  # noqa: E402

# the `pdfleet epp` processes serve only the Envoy that sends this run's caller token
CALLER_TOKEN = secrets.token_hex(32)
EPP_ENV = {**os.environ, EPP_CALLER_TOKEN: CALLER_TOKEN}

CLIENTS = 4


async def one_round(url: str, reqs: list, salt: str) -> dict:
    ttft: list[float] = []
    failed = fallback = 0
    queue: asyncio.Queue = asyncio.Queue()
    for r in reqs:
        queue.put_nowait(r)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        async def worker() -> None:
            nonlocal failed, fallback
            while not queue.empty():
                req = queue.get_nowait()
                body = {**req.body, "stream": True, "cache_salt": salt}
                t0 = time.perf_counter()
                first = None
                async with client.stream("POST", url + req.path, json=body) as resp:
                    fallback += FALLBACK_HEADER in resp.headers
                    async for line in resp.aiter_lines():
                        if first is None and line.startswith("data:") and '"text"' in line:
                            first = time.perf_counter() - t0
                    if resp.status_code != 200 or first is None:
                        failed += 1
                    else:
                        ttft.append(first)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CLIENTS)))
        wall = time.perf_counter() - started
    return {"requests": len(reqs), "wall_s": wall, "ttft": ttft, "failed": failed, "fallback": fallback}


def buckets(metrics_url: str) -> dict[float, float]:
    return metrics_text.buckets(metrics_text.samples(httpx.get(metrics_url, timeout=10).text), EPP_DECISION)


def quantile(hist: dict[float, float], q: float) -> float:
    value = metrics_text.histogram_quantile(q, hist)
    return float("nan") if value is None else value


def pct(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(round(q * (len(v) - 1))))] if v else float("nan")


def cpu(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


async def _fakes_run(requests: int, concurrency: int, mdir: str) -> dict:
    """The EPP's own costs without engines' noise: fake engines (tests/support/router_fakes.py)
    in this process, `pdfleet epp` and `pdfleet router` as processes on them, the same requests through
    Envoy + EPP and through the router."""
    sys.path.insert(0, str(REPO / "tests" / "support"))
    from router_fakes import FakeEngine

    from pdfleet.operator.local.tiny_model import build_corpus

    engines = [FakeEngine(name=f"p{i}", role="prefill") for i in range(2)] + [FakeEngine(name="d0", role="decode")]
    for e in engines:
        await e.start()
    lines = build_corpus(seed=5, sentences=3000)
    # 16 system prompts of ~300 words, each with its own tails: prefix-aware scoring has work to do
    bodies = [{"model": "tiny", "prompt": " ".join(lines[20 * (i % 16):20 * (i % 16) + 20]) + f" user {i}: "
               + " ".join(lines[400 + i % 500:402 + i % 500]), "max_tokens": 8} for i in range(requests)]
    base = RouterConfig(prefill=(engines[0].url, engines[1].url), decode=(engines[2].url,), tokenizer=mdir,
                        block_size=BLOCK, prefill_policy=PREFIX_AWARE, decode_policy=PREFIX_AWARE)
    out = {}
    procs = []
    try:
        import dataclasses

        router_cfg = dataclasses.replace(base, port=free_port())
        epp_cfg = dataclasses.replace(base, port=free_port())
        grpc_port = free_port()
        router = subprocess.Popen([sys.executable, "-m", "pdfleet.operator.cli", "router", *router_cfg.to_argv(),
                                   "--log-level", "WARNING"], stderr=subprocess.DEVNULL)
        epp = subprocess.Popen([sys.executable, "-m", "pdfleet.operator.cli", "epp", *epp_cfg.to_argv(),
                                "--grpc-port", str(grpc_port), "--grpc-health-port", str(free_port()),
                                "--log-level", "WARNING"], stdout=subprocess.DEVNULL, env=EPP_ENV)
        procs += [router, epp]
        async with httpx.AsyncClient(timeout=60) as client:
            for port in (router_cfg.port, epp_cfg.port):
                for _ in range(600):
                    try:
                        health = (await client.get(f"http://127.0.0.1:{port}/health")).json()
                        if health["prefix_routing"].get("tokenizer"):
                            break
                    except (httpx.HTTPError, ValueError, KeyError):
                        pass
                    await asyncio.sleep(0.2)
        envoy = Envoy(render(BUFFERED, listen_port=0, epp_port=grpc_port, admin_port=0, caller_token=CALLER_TOKEN,
                             decode_only=base.decode, epp_tls=True))  # pdfleet epp serves TLS, as in a cluster
        envoy.start()
        listen = envoy.listener_port()
        procs.append(envoy)
        metrics_url = f"http://127.0.0.1:{epp_cfg.port}/metrics"
        paths = {"router": (f"http://127.0.0.1:{router_cfg.port}", [router.pid]),
                 "gateway": (f"http://127.0.0.1:{listen}", [epp.pid, envoy.proc.pid])}
        async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)) as client:
            for name, (url, pids) in paths.items():
                for b in bodies[:32]:  # warm: connections, the tokenizer's caches
                    await client.post(url + "/v1/completions", json=b)
                c0, h0 = [cpu(p) for p in pids], buckets(metrics_url)
                queue: asyncio.Queue = asyncio.Queue()
                for b in bodies:
                    queue.put_nowait(b)
                lat: list[float] = []
                bad = 0

                async def worker(url: str = url, queue: asyncio.Queue = queue, lat: list = lat) -> None:
                    nonlocal bad
                    while not queue.empty():
                        b = queue.get_nowait()
                        t0 = time.perf_counter()
                        r = await client.post(url + "/v1/completions", json=b)
                        lat.append(time.perf_counter() - t0)
                        bad += r.status_code != 200 or "kv_seen" not in r.text

                started = time.perf_counter()
                await asyncio.gather(*(worker() for _ in range(concurrency)))
                wall = time.perf_counter() - started
                used = [cpu(p) - c for p, c in zip(pids, c0)]
                row = {"req_per_s": round(len(bodies) / wall, 1), "latency_p50_ms": round(pct(lat, 0.5) * 1e3, 2),
                       "latency_p99_ms": round(pct(lat, 0.99) * 1e3, 2), "failed": bad,
                       "cpu_ms_per_request": round(used[0] / len(bodies) * 1e3, 3)}
                if name == "gateway":
                    h1 = buckets(metrics_url)
                    hist = {le: n - h0.get(le, 0.0) for le, n in h1.items()}
                    row["envoy_cpu_ms_per_request"] = round(used[1] / len(bodies) * 1e3, 3)
                    row["epp_decision_ms"] = {"p50": round(quantile(hist, 0.5) * 1e3, 3),
                                              "p99": round(quantile(hist, 0.99) * 1e3, 3)}
                out[name] = row
                print(name, row, flush=True)
    finally:
        for p in procs:
            if isinstance(p, Envoy):
                p.stop()
            else:
                p.terminate()
                p.wait(30)
        for e in engines:
            await e.stop()
    return out


EVICT_BYTES = 64 * 1024 * 1024  # more than this machine's caches hold


def _evict(buf: bytearray) -> None:
    """Write every cache line of ``buf``: what the caches held before (the decision's code and data) is gone."""
    for i in range(0, len(buf), 64):
        buf[i] ^= 1


async def _replay(picker, routing, rounds: int, reqs: list, cold: bool = False) -> dict[str, list[float]]:
    """The decision's parts per request, as exchange.py times them; ``routing``: fill the engines'
    indexes as their events would (prefix-aware), else None; ``cold``: the CPU caches evicted before
    each request, as other processes and the EPP's own I/O evict them between requests on a fleet."""
    from pdfleet.connector.serving.endpoints import DECODE, PREFILL

    evict = bytearray(EVICT_BYTES) if cold else None

    parts: dict[str, list[float]] = {"choose_pair": [], "decide": [], "prefill pick": [], "decode pick": [],
                                     "decision": []}
    clock = time.perf_counter
    for k in range(rounds):
        for req in reqs:
            body = {**req.body, "stream": True, "cache_salt": f"decision-{k}"}
            if evict is not None:
                _evict(evict)
            t0 = clock()
            pair = picker.choose_pair(body, chat=False, request_id="r", headers={})
            t1 = clock()
            picker.decide(pair, body, chat=False, decodes=pair.ready(DECODE))
            t2 = clock()
            prefill = picker.pick(PREFILL, pair.ready(PREFILL), (), body, False)
            t3 = clock()
            decode = picker.pick(DECODE, pair.ready(DECODE), (), body, False)
            t4 = clock()
            if k:  # round 0 warms the tokenizer, the hasher and the metrics' children
                for name, dt in zip(parts, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
                    parts[name].append(dt)
            if routing is not None:  # what the two engines' events would now say they hold
                held = list(routing.keys_for(body, False).exact(routing.hasher))
                for url in (prefill, decode):
                    routing.states[url].index.hashes.update(held)
                await asyncio.sleep(0)  # the loop's turn: the prompt is remembered (prefix_routing.py)
                await routing.settle()
    return parts


def _decision_run(rounds: int, mdir: str, cold: bool = False) -> dict:
    from pdfleet.connector.serving.endpoints import Endpoint, RevisionEndpoints
    from pdfleet.connector.serving.kvaware.prefix_routing import PrefixRouting, load_tokenizer
    from pdfleet.connector.serving.router_state import RouterState
    from pdfleet.contract.routing import LEAST_OUTSTANDING

    tokenizer = load_tokenizer(mdir)
    group = RevisionEndpoints("r1", serving=True,
                              prefill=(Endpoint("http://p0", kv_events="tcp://p0:1"), Endpoint("http://p1", kv_events="tcp://p1:1")),
                              decode=(Endpoint("http://d0", kv_events="tcp://d0:1"),))
    reqs = workload()
    out = {}
    for policy in (LEAST_OUTSTANDING, PREFIX_AWARE):
        config = RouterConfig(prefill=("http://p0", "http://p1"), decode=("http://d0",), tokenizer=mdir,
                              block_size=BLOCK, prefill_policy=policy, decode_policy=policy)
        state = RouterState(config)
        picker = state.picker
        # the EPP's own PrefixRouting, its tokenizer loaded now (the EPP loads it in the background)
        picker.prefix = routing = PrefixRouting(config, state.metrics, tokenize=tokenizer, labels=picker.labels)
        picker.set_endpoints([group])
        for engine in routing.states.values():
            engine.synced = True  # as after the replay of its event stream
        parts = asyncio.run(_replay(picker, routing if policy == PREFIX_AWARE else None, rounds, reqs, cold))
        out[policy] = {name: {"p50_us": round(pct(v, 0.5) * 1e6, 1), "p99_us": round(pct(v, 0.99) * 1e6, 1)}
                       for name, v in parts.items()}
        print(policy, json.dumps(out[policy]), flush=True)
    out["prefix_aware_over_baseline_p50"] = round(out[PREFIX_AWARE]["decision"]["p50_us"]
                                                  / out[LEAST_OUTSTANDING]["decision"]["p50_us"], 2)
    return out


def _replay_beside(gateway: str, reqs: list, rounds: int) -> dict:
    """The --decision replay as its own process while gateway rounds (not counted) keep the fleet busy."""
    proc = subprocess.Popen([sys.executable, __file__, "--decision", str(rounds)], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    k = 0
    while proc.poll() is None:
        asyncio.run(one_round(gateway, reqs, f"bench-load-{k}"))
        k += 1
    out = proc.stdout.read()
    loaded = json.loads(out[out.index("\n{") + 1:])[PREFIX_AWARE]["decision"]
    print(f"decision replay beside {k} gateway round(s): {loaded}", flush=True)
    return loaded


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=2, help="rounds per path (alternating); default %(default)s")
    ap.add_argument("--fakes", type=int, default=0, metavar="N",
                    help="instead of a fleet: N requests over fake engines (light: run under "
                         "/tmp/pdfleet-cpu.lock), for the EPP's own decision time and CPU per request")
    ap.add_argument("--concurrency", type=int, default=8, help="with --fakes; default %(default)s")
    ap.add_argument("--decision", type=int, default=0, metavar="R",
                    help="instead of a fleet: R rounds of the EPP's decision core in this process (light)")
    ap.add_argument("--cold", action="store_true", help="with --decision: the CPU caches evicted before each request")
    ap.add_argument("--replay", type=int, default=10, metavar="R",
                    help="on a fleet: the --decision replay before the fleet (quiet) and beside its load; 0: off")
    args = ap.parse_args()
    if args.decision:
        print(json.dumps(_decision_run(args.decision, str(model_dir()), args.cold), indent=2))
        return 0
    if args.fakes:
        print(json.dumps(asyncio.run(_fakes_run(args.fakes, args.concurrency, str(model_dir()))), indent=2))
        return 0
    reqs = workload()
    mdir = model_dir()
    replay = {}
    if args.replay:
        replay = {temp: _decision_run(args.replay, str(mdir), cold)[PREFIX_AWARE]["decision"]
                  for temp, cold in (("quiet", False), ("quiet_cold_caches", True))}
    with tempfile.TemporaryDirectory(prefix="pdfleet-gateway-bench-") as tmp:
        work = Path(tmp)
        cr = yaml.safe_load(TINY_CR.read_text())
        cr["spec"]["prefill"]["replicas"] = 2
        cr["spec"]["decode"]["replicas"] = 1
        cr["spec"]["router"] = {"prefillPolicy": PREFIX_AWARE, "decodePolicy": PREFIX_AWARE}
        path = work / "cr.yaml"
        path.write_text(yaml.safe_dump(cr))
        with local_fleet(work / "fleet", cr=path) as fleet:
            engines = fleet.state()["engines"]
            config = RouterConfig(
                prefill=tuple(e["url"] for e in engines if e["role"] == "prefill"),
                decode=tuple(e["url"] for e in engines if e["role"] == "decode"),
                kv_events=tuple((e["url"], ",".join(kv_events_endpoints(str(fleet.run_dir.resolve()), e["name"])))
                                for e in engines),
                tokenizer=str(mdir), block_size=BLOCK, hash_seed=hash_seed(tiny_spec()),
                prefill_policy=PREFIX_AWARE, decode_policy=PREFIX_AWARE, port=free_port())
            grpc_port = free_port()
            epp = subprocess.Popen([sys.executable, "-m", "pdfleet.operator.cli", "epp", *config.to_argv(),
                                    "--grpc-port", str(grpc_port), "--grpc-health-port", str(free_port()),
                                    "--log-level", "WARNING"],
                                   stdout=subprocess.PIPE, text=True, env=EPP_ENV)
            envoy = None
            try:
                line = epp.stdout.readline()
                assert line.startswith("epp: "), line
                metrics_url = f"http://127.0.0.1:{config.port}/metrics"
                for _ in range(600):  # the EPP's tokenizer (prefix-aware scoring by exact hashes)
                    health = httpx.get(f"http://127.0.0.1:{config.port}/health", timeout=10)
                    if health.status_code == 200 and health.json()["prefix_routing"].get("tokenizer"):
                        break
                    time.sleep(0.2)
                envoy = Envoy(render(BUFFERED, listen_port=0, epp_port=grpc_port, admin_port=0, epp_tls=True,
                                     caller_token=CALLER_TOKEN, decode_only=config.decode,
                                     message_timeout_s=message_timeout_for(config.prefill_timeout_s,
                                                                           config.prefill_attempts)))
                envoy.start()
                gateway = f"http://127.0.0.1:{envoy.listener_port()}"
                paths = {"router": (fleet.router, fleet.proc.pid), "gateway": (gateway, epp.pid)}
                results = {p: [] for p in paths}
                cpu_s = {"router": 0.0, "gateway": 0.0, "envoy": 0.0}
                hist = {}
                for k in range(args.rounds):
                    for name, (url, pid) in paths.items():
                        c0, e0, h0 = cpu(pid), cpu(envoy.proc.pid), buckets(metrics_url)
                        r = asyncio.run(one_round(url, reqs, f"bench-{name}-{k}"))
                        cpu_s[name] += cpu(pid) - c0
                        if name == "gateway":
                            cpu_s["envoy"] += cpu(envoy.proc.pid) - e0
                            h1 = buckets(metrics_url)
                            for le, n in h1.items():
                                hist[le] = hist.get(le, 0.0) + n - h0.get(le, 0.0)
                        results[name].append(r)
                        print(f"round {k} {name}: {r['requests'] / r['wall_s'] * 60:.0f} req/min, TTFT p50 "
                              f"{statistics.median(r['ttft']) * 1e3:.0f} ms, failed {r['failed']}, "
                              f"fallback {r['fallback']}", flush=True)
                if args.replay:
                    replay["loaded"] = _replay_beside(gateway, reqs, args.replay)
            finally:
                if envoy is not None:
                    envoy.stop()
                epp.terminate()
                epp.wait(60)
    summary = {}
    for name, rounds in results.items():
        n = sum(r["requests"] for r in rounds)
        ttft = [t for r in rounds for t in r["ttft"]]
        summary[name] = {"req_per_min": round(n / sum(r["wall_s"] for r in rounds) * 60, 1),
                         "ttft_p50_ms": round(pct(ttft, 0.5) * 1e3, 1), "ttft_p99_ms": round(pct(ttft, 0.99) * 1e3, 1),
                         "failed": sum(r["failed"] for r in rounds), "fallback": sum(r["fallback"] for r in rounds),
                         "cpu_ms_per_request": round(cpu_s[name] / n * 1e3, 2)}
    n = sum(r["requests"] for r in results["gateway"])
    summary["gateway"]["envoy_cpu_ms_per_request"] = round(cpu_s["envoy"] / n * 1e3, 2)
    summary["epp_decision_ms"] = {"p50": round(quantile(hist, 0.5) * 1e3, 3), "p99": round(quantile(hist, 0.99) * 1e3, 3),
                                  "count": hist.get(float("inf"), 0)}
    if replay:
        replay["loaded_over_quiet_p50"] = round(replay["loaded"]["p50_us"] / replay["quiet"]["p50_us"], 2)
        replay["cold_over_quiet_p50"] = round(replay["quiet_cold_caches"]["p50_us"] / replay["quiet"]["p50_us"], 2)
        summary["decision_replay_us"] = replay
    summary["gateway_vs_router"] = {
        "req_per_min": round(summary["gateway"]["req_per_min"] / summary["router"]["req_per_min"], 3),
        "ttft_p50": round(summary["gateway"]["ttft_p50_ms"] / summary["router"]["ttft_p50_ms"], 3)}
    print(json.dumps(summary, indent=2))
    return 0 if all(summary[p]["failed"] == 0 for p in paths) else 1


if __name__ == "__main__":
    sys.exit(main())
