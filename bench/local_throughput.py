"""Requests/min of fresh local fleets under a shared-prefix workload: a plain vLLM server, a
1 prefill + 1 decode and a 2 prefill + 1 decode `pdfleet local` fleet, measured in one run.

    flock /tmp/pdfleet-heavy.lock .venv/bin/python bench/local_throughput.py [--rounds 3] [--fleets 1]

The workload (issue 17): 32 completions (max_tokens 8, temperature 0) over 8 system prompts of about
150 words, each with 4 different user tails, sent by 4 concurrent clients through the fleet's router
(leastOutstanding). Each fleet is fresh: round 1 starts right after the router line (which
`pdfleet local` prints once every prefill/decode pair is warmed; --warmup-baseline adds fleets
started with --warmup-rounds 0, --nap-baseline fleets whose readers spin with sched_yield). Per round:
requests/min, p50/p99/max latency, failed requests. Per fleet: failed pulls by reason (from decode's
log), decode's prompt tokens by source (computed itself, pulled; vLLM's counters),
and the side channel's reply latency (a signed heartbeat to every prefill every 50 ms while
the load runs; the answer "unknown request" is what a real heartbeat waits for too).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e" / "local"))

from local_fleet import TINY_CR, Answer, ask, completion, local_fleet, metric_sum, model_dir, reference_server  # noqa: E402

from pdfleet.connector.transfer import wire  # noqa: E402
from pdfleet.contract.env import VLLM_SHM_SPIN_MS as SHM_SPIN_ENV, VLLM_SHM_SPIN_NAP_US as SHM_NAP_ENV  # noqa: E402
from pdfleet.contract.routing import LEAST_OUTSTANDING  # noqa: E402
from pdfleet.connector.transfer.sidechannel import SideChannelClient, SideChannelError  # noqa: E402
from pdfleet.operator.local.tiny_model import build_corpus  # noqa: E402
from pdfleet.operator.plan.engine import SECRET_FILE  # noqa: E402

SYSTEM_PROMPTS = 8
TAILS = 4
CLIENTS = 4
PROBE_INTERVAL_S = 0.05
PULL_FAILED = re.compile(r"KV pull (?:of \S+ failed, vLLM will recompute or fail it|refused, computing the prompt"
                         r" locally|of \S+ failed): (.*)$")


def workload() -> list:
    lines = build_corpus(seed=41, sentences=2000)
    reqs = []
    for s in range(SYSTEM_PROMPTS):
        system = f"System {s}. " + " ".join(lines[40 * s:40 * s + 12])  # about 150 words
        for t in range(TAILS):
            tail = " ".join(lines[1000 + 40 * s + 3 * t:1000 + 40 * s + 3 * t + 2])
            reqs.append(completion(f"s{s} t{t}", f"{system}\n\nUser: {tail}", max_tokens=8))
    # Interleaved, as users arrive: every system prompt's first turn early, later turns after.
    return [reqs[s * TAILS + t] for t in range(TAILS) for s in range(SYSTEM_PROMPTS)]


async def one_round(url: str, reqs: list) -> dict:
    latencies: list[float] = []
    answers: list[Answer] = []
    queue: asyncio.Queue = asyncio.Queue()
    for r in reqs:
        queue.put_nowait(r)
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        async def worker() -> None:
            while not queue.empty():
                req = queue.get_nowait()
                t0 = time.perf_counter()
                answers.append(await ask(client, url, req))
                latencies.append(time.perf_counter() - t0)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(CLIENTS)))
        wall = time.perf_counter() - started
    lat = sorted(latencies)
    return {
        "rpm": len(reqs) / wall * 60,
        "p50": statistics.median(lat),
        "p99": lat[min(len(lat) - 1, int(round(0.99 * (len(lat) - 1))))],
        "max": lat[-1],
        "failed": sum(1 for a in answers if a.status != 200 or a.error),
        "fallback": sum(1 for a in answers if a.fallback),
    }


class SideChannelProbe:
    """Signed heartbeats for an unknown request to each prefill's side channel, timed, in a thread."""

    def __init__(self, endpoints: list[tuple[str, int]], secret: bytes) -> None:
        self.endpoints = endpoints
        self.secret = secret
        self.samples: list[float] = []
        self.lost = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> "SideChannelProbe":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        client = SideChannelClient(secret=self.secret)
        try:
            while not self._stop.is_set():
                calls = []
                for host, port in self.endpoints:
                    req = wire.HeartbeatRequest(id=SideChannelClient.next_id(), request_ids=["probe"], agent="probe")
                    calls.append((time.monotonic(), client.submit(host, port, req, timeout=10.0, attempts=1)))
                for sent, call in calls:
                    while not call.done():
                        client.poll()
                        time.sleep(0.0005)
                    try:
                        call.result()
                        self.samples.append(time.monotonic() - sent)
                    except SideChannelError:
                        self.lost += 1
                self._stop.wait(PROBE_INTERVAL_S)
        finally:
            client.close()

    def summary(self) -> dict:
        s = sorted(self.samples) or [float("nan")]
        return {"sc_p50_ms": statistics.median(s) * 1e3, "sc_p99_ms": s[int(0.99 * (len(s) - 1))] * 1e3,
                "sc_max_ms": s[-1] * 1e3, "sc_samples": len(self.samples), "sc_lost": self.lost}


def pull_failures(logs: list[Path]) -> Counter:
    reasons: Counter = Counter()
    for log in logs:
        for line in log.read_text(errors="replace").splitlines():
            m = PULL_FAILED.search(line)
            if m:
                # One bucket per kind of reason: numbers and addresses out.
                reasons[re.sub(r"[\d.:]+", "N", m.group(1))[:90]] += 1
    return reasons


def prompt_tokens(decode_urls: list[str]) -> tuple[float, float]:
    """(prompt tokens decode computed itself, prompt tokens it pulled) over the decodes. Decode always
    computes the tail of a prompt that does not fill a block; a failed pull adds the whole prompt."""
    local = pulled = 0.0
    for url in decode_urls:
        text = httpx.get(url + "/metrics", timeout=10).text
        local += metric_sum(text, "vllm:prompt_tokens_by_source_total", source="local_compute")
        pulled += metric_sum(text, "vllm:prompt_tokens_by_source_total", source="external_kv_transfer")
    return local, pulled


def run_fleet(work: Path, prefill: int, reqs: list, rounds: int, engine_env: dict | None = None,
              runner_args: tuple[str, ...] = ()) -> dict:
    cr = yaml.safe_load(TINY_CR.read_text())
    if engine_env:
        engine = cr["spec"].setdefault("engine", {})
        engine["env"] = [*engine.get("env", []), *({"name": k, "value": v} for k, v in engine_env.items())]
    cr["spec"]["prefill"]["replicas"] = prefill
    cr["spec"]["decode"]["replicas"] = 1
    cr["spec"]["router"] = {"prefillPolicy": LEAST_OUTSTANDING, "decodePolicy": LEAST_OUTSTANDING}
    work.mkdir(parents=True)
    path = work / "cr.yaml"
    path.write_text(yaml.safe_dump(cr))
    with local_fleet(work, cr=path, extra_args=tuple(runner_args)) as fleet:
        state = fleet.state()
        prefills = [("127.0.0.1", e["side_channel_port"]) for e in state["engines"] if e["role"] == "prefill"]
        decodes = [e for e in state["engines"] if e["role"] == "decode"]
        secret = (fleet.run_dir / SECRET_FILE).read_bytes()
        before = prompt_tokens([e["url"] for e in decodes])
        out = {"rounds": []}
        with SideChannelProbe(prefills, secret) as probe:
            for _ in range(rounds):
                out["rounds"].append(asyncio.run(one_round(fleet.router, reqs)))
        out.update(probe.summary())
        after = prompt_tokens([e["url"] for e in decodes])
        out["local_tokens"], out["pulled_tokens"] = after[0] - before[0], after[1] - before[1]
        out["pull_failures"] = pull_failures([Path(e["log"]) for e in decodes])
        out["cpus"] = {e["name"]: e["cpus"] for e in state["engines"]}
        # Read right after the router line: every restart so far was an engine started again on new
        # ports because one it was given was taken (operator/local/ports.py), not a crash under load.
        out["port_restarts"] = sum(e.get("restarts", 0) for e in state["engines"])
    return out


def fmt_round(name: str, k: int, r: dict) -> str:
    return (f"{name:14}{k:>6}{r['rpm']:10.0f}{r['p50']:9.2f}{r['p99']:9.2f}{r['max']:9.2f}"
            f"{r['failed']:8d}{r['fallback']:9d}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fleets", type=int, default=1, help="fresh 2 + 1 fleets to start (each measured)")
    parser.add_argument("--skip-plain", action="store_true")
    parser.add_argument("--skip-1p1d", action="store_true")
    parser.add_argument("--spin-baseline", action="store_true",
                        help="after each 2 + 1 fleet, a fresh one whose engines spin as vLLM does (1 s after a read:"
                             f" {SHM_SPIN_ENV}=1000), the baseline for the spin cap `pdfleet local` sets on shared CPUs")
    parser.add_argument("--warmup-baseline", action="store_true",
                        help="after each 2 + 1 fleet, a fresh one started with --warmup-rounds 0: the baseline for"
                             " the pair warm-up `pdfleet local` runs before its router line")
    parser.add_argument("--nap-baseline", action="store_true",
                        help=f"after each 2 + 1 fleet, a fresh one whose capped readers spin with sched_yield ({SHM_NAP_ENV}=0):"
                             " the baseline for the sleep between polls `pdfleet local` sets")
    args = parser.parse_args()

    mdir = model_dir()
    reqs = workload()
    print(f"workload: {len(reqs)} completions, {SYSTEM_PROMPTS} system prompts x {TAILS} tails, max_tokens 8,"
          f" {CLIENTS} clients; {args.rounds} rounds per target", flush=True)
    print(f"{'target':14}{'round':>6}{'req/min':>10}{'p50 s':>9}{'p99 s':>9}{'max s':>9}{'failed':>8}"
          f"{'fallback':>9}", flush=True)
    # Kept when a fleet fails, so that its engines' logs can be read (local_fleet names the run dir).
    work = Path(tempfile.mkdtemp(prefix="pdfleet-throughput-"))
    if not args.skip_plain:
        with reference_server(work, mdir) as url:
            for k in range(args.rounds):
                print(fmt_round("plain server", k + 1, asyncio.run(one_round(url, reqs))), flush=True)
    targets = [] if args.skip_1p1d else [("1P+1D", 1, None, ())]
    for i in range(args.fleets):
        targets.append((f"2P+1D #{i + 1}", 2, None, ()))
        if args.spin_baseline:
            targets.append((f"2P+1D #{i + 1} 1s", 2, {SHM_SPIN_ENV: "1000"}, ()))
        if args.warmup_baseline:
            targets.append((f"2P+1D #{i + 1} cold", 2, None, ("--warmup-rounds", "0")))
        if args.nap_baseline:
            targets.append((f"2P+1D #{i + 1} yield", 2, {SHM_NAP_ENV: "0"}, ()))
    summaries = []
    failed_starts = 0
    for i, (name, prefill, env, runner_args) in enumerate(targets):
        try:
            res = run_fleet(work / f"fleet-{i}", prefill, reqs, args.rounds, env, runner_args)
        except AssertionError as exc:  # an engine that did not start: reported, and the run goes on
            failed_starts += 1
            print(f"{name:14} did not start: {str(exc).splitlines()[0]} (logs in {work / f'fleet-{i}'})", flush=True)
            continue
        for k, r in enumerate(res["rounds"]):
            print(fmt_round(name, k + 1, r), flush=True)
        summaries.append((name, res))
    print("\nper fleet: side-channel reply latency under load (ms), decode's prompt tokens (computed itself /"
          " pulled), failed pulls by reason")
    for name, res in summaries:
        print(f"{name:14} p50 {res['sc_p50_ms']:.1f}  p99 {res['sc_p99_ms']:.1f}  max {res['sc_max_ms']:.1f}"
              f"  ({res['sc_samples']} samples, {res['sc_lost']} lost)  tokens local {res['local_tokens']:.0f} / pulled {res['pulled_tokens']:.0f}"
              f"  CPUs {res['cpus']}  port restarts {res['port_restarts']}")
        for reason, n in res["pull_failures"].most_common():
            print(f"{'':14}   {n:4d} x {reason}")
    print(f"\nfleets started: {len(summaries)} of {len(targets)}; engines started again on new ports at start"
          f" (a port taken): {sum(res['port_restarts'] for _, res in summaries)}")
    if failed_starts:
        print(f"{failed_starts} fleet(s) did not start; their logs are kept in {work}")
        return 1
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
