"""Scale from zero as a pair on `pdfleet local` (issue 41): cycles of 0 -> 1 -> 0 under a burst, and where a
wake's time goes.

    flock /tmp/pdfleet-vllm.lock .venv/bin/python bench/scale_from_zero.py --cycles 20 --burst 20 [--gateway]
    flock /tmp/pdfleet-vllm.lock .venv/bin/python bench/scale_from_zero.py --compare --cycles 3 --burst 4

One fleet from examples/tiny-cpu-scale-to-zero.yaml (idleSeconds 5). Each cycle waits until the pair is at
zero (both engines stopped), sends a burst of streamed completions through the front end (the router, or
Envoy and the Endpoint Picker with --gateway), and records per request its status, the P/D headers and the
time to its first token. Checks: 0 lost (every answer 200 and whole), 0 duplicated (each request id answered
once), 0 answered decode-alone. Prints per cycle, and the medians: first request -> first token, and the
wake's parts as `pdfleet local` measured them (activation: first held request -> engines started; engine
start: -> every engine healthy; offer: -> the front ends serve the pair).

--compare runs three fleets one after the other in the same run and prints each one's medians and the
ratios to the first: "before" (the engines started as fresh interpreters, `--no-launcher`, and vLLM's
multiprocessing executor: the CR without its in-process executor settings), "launcher" (the same CR, the
engines forked by `pdfleet local`'s pre-imported launcher, operator/local/launcher.py), and "after" (the CR as
it is: the launcher and the in-process executor). After each wake, --after sequential requests measure
serving as usual (latency p50), so a faster wake that serves slower shows.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e" / "local"))

from local_fleet import MODEL, local_fleet  # noqa: E402

from pdfleet.contract.routing import DISAGGREGATION_HEADER, FALLBACK_HEADER, REMOTE_PREFILL  # noqa: E402
from pdfleet.operator.local.scale_to_zero import RETIRED_LINE as AT_ZERO  # noqa: E402
from pdfleet.operator.local.scale_to_zero import WAKE_LINE  # noqa: E402

CR = REPO / "examples" / "tiny-cpu-scale-to-zero.yaml"


async def one(client: httpx.AsyncClient, base: str, k: int, sent: float) -> dict:
    body = {"model": MODEL, "prompt": f"Request {k}: the river runs", "max_tokens": 8, "temperature": 0,
            "ignore_eos": True, "stream": True}
    out = {"id": f"stz-{k}-{time.monotonic_ns()}", "status": 0, "ttft_s": None, "done": False}
    try:
        async with client.stream("POST", base + "/v1/completions", json=body,
                                 headers={"x-request-id": out["id"]}) as resp:
            out["status"] = resp.status_code
            out["fallback"] = resp.headers.get(FALLBACK_HEADER)
            out["disaggregation"] = resp.headers.get(DISAGGREGATION_HEADER, "")
            out["answered_id"] = resp.headers.get("x-request-id")
            async for line in resp.aiter_lines():
                if line.startswith("data:") and out["ttft_s"] is None and "[DONE]" not in line:
                    out["ttft_s"] = time.monotonic() - sent
                if line.strip() == "data: [DONE]":
                    out["done"] = True
    except httpx.HTTPError as exc:
        out["error"] = repr(exc)
    return out


async def burst(base: str, n: int) -> list[dict]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        sent = time.monotonic()
        return await asyncio.gather(*(one(client, base, k, sent) for k in range(n)))


async def sequential(base: str, n: int) -> list[float]:
    """Seconds per whole request, one after the other (the pair awake)."""
    out = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as client:
        for k in range(n):
            sent = time.monotonic()
            a = await one(client, base, 1000 + k, sent)
            if a["status"] == 200 and a["done"]:
                out.append(time.monotonic() - sent)
    return out


# The in-process executor's settings (examples/tiny-cpu-scale-to-zero.yaml): without them vLLM's CPU platform
# runs the worker in a process of its own, spawned by the engine core (one more interpreter importing vLLM).
UNI_ARGS = ("--distributed-executor-backend", "uni")
UNI_ENV = "VLLM_ENABLE_V1_MULTIPROCESSING"


def without_in_process_executor(cr: Path, out: Path) -> Path:
    doc = yaml.safe_load(cr.read_text())
    engine = doc["spec"]["engine"]
    args = list(engine.get("extraArgs", []))
    for i in range(len(args) - 1):
        if tuple(args[i:i + 2]) == UNI_ARGS:
            del args[i:i + 2]
            break
    engine["extraArgs"] = args
    engine["env"] = [e for e in engine.get("env", []) if e["name"] != UNI_ENV]
    out.write_text(yaml.safe_dump(doc))
    return out


def wait_for(fleet, text: str, count: int, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while fleet.stderr().count(text) < count:
        if time.monotonic() > deadline or fleet.proc.poll() is not None:
            raise SystemExit(f"no {count} x {text!r}:\n{fleet.stderr()[-3000:]}")
        time.sleep(0.2)


def wakes(stderr: str) -> list[dict[str, float]]:
    out = []
    for line in stderr.splitlines():
        if WAKE_LINE in line:
            parts = line.split(WAKE_LINE, 1)[1].split()
            out.append({k: float(v) for k, v in (p.split("=") for p in parts)})
    return out


# Where an engine's start goes, from its own log (second resolution): each mark is the first line, after the
# engine started again, that shows the phase reached.
PHASES = (("api_server_up", "(APIServer pid="), ("engine_core_up", "Initializing a V1 LLM engine"),
          ("worker_up", "Starting to load model"), ("model_loaded", "Loading weights took"),
          ("kv_and_connector_ready", "init engine (profile, create kv cache, warmup model) took"),
          ("serving", "Starting vLLM server"))


def engine_phases(log: str) -> dict[str, float]:
    """Seconds from the engine's first log line to each phase, for the engine's last start in ``log``."""
    start = log.rfind("non-default args")
    segment = log[log.rfind("\n", 0, start) + 1:] if start >= 0 else log
    stamps: dict[str, float] = {}
    for name, needle in PHASES:
        for line in segment.splitlines():
            if needle in line and " INFO " in line:
                hms = line.split(" INFO ", 1)[1].split()[1]
                h, m, sec = (int(x) for x in hms.split(":"))
                stamps[name] = h * 3600 + m * 60 + sec
                break
    base = stamps.get("api_server_up")
    return {k: v - base for k, v in stamps.items() if base is not None and k != "api_server_up"}


def run_fleet(args: argparse.Namespace, variant: str, cr: Path, launcher: bool) -> list[dict]:
    """One fleet, ``args.cycles`` wakes under a burst: a row per cycle."""
    rows = []
    extra = (("--gateway",) if args.gateway else ()) + (() if launcher else ("--no-launcher",))
    with tempfile.TemporaryDirectory(prefix="pdfleet-stz-") as tmp:
        with local_fleet(Path(tmp) / "fleet", cr=cr, extra_args=extra) as fleet:
            base = fleet.router
            if args.gateway:
                while not base.startswith("http") or base == fleet.router:
                    line = fleet.next_line(60.0)
                    if line is None:
                        raise SystemExit(fleet.stderr()[-3000:])
                    if line.startswith("gateway: http"):
                        base = line[len("gateway: "):]
            forked = "forked by the launcher" in fleet.stderr()
            if forked != launcher:
                raise SystemExit(f"launcher {'on' if launcher else 'off'} asked, but engines "
                                 f"{'were' if forked else 'were not'} forked by it:\n{fleet.stderr()[-3000:]}")
            for cycle in range(1, args.cycles + 1):
                wait_for(fleet, AT_ZERO, cycle)
                answers = asyncio.run(burst(base, args.burst))
                wait_for(fleet, WAKE_LINE, cycle)
                ids = [a.get("answered_id") for a in answers]
                lost = [a for a in answers if a["status"] != 200 or not a["done"]]
                alone = [a for a in answers if a.get("fallback") or not a.get("disaggregation", "").startswith(
                    REMOTE_PREFILL)]
                duplicated = len(ids) - len(set(ids))
                ttfts = sorted(a["ttft_s"] for a in answers if a["ttft_s"] is not None)
                wake = wakes(fleet.stderr())[-1]
                phases = engine_phases((fleet.run_dir / "prefill-0.log").read_text(errors="replace"))
                if "serving" in phases:  # from the start: first the API server's interpreter and imports
                    first = max(0.0, round(wake["engine_start_s"] - phases["serving"]))
                    phases = {"api_server_first_line": first, **{k: v + first for k, v in phases.items()}}
                served = sorted(asyncio.run(sequential(base, args.after))) if args.after else []
                row = {"variant": variant, "cycle": cycle,
                       "first_token_s": round(ttfts[0], 2) if ttfts else None,
                       "last_first_token_s": round(ttfts[-1], 2) if ttfts else None, "lost": len(lost),
                       "duplicated": duplicated, "decode_alone": len(alone),
                       **{k: round(v, 2) for k, v in wake.items()},
                       "awake_request_ms_p50": round(1000 * statistics.median(served), 1) if served else None,
                       "awake_answered": len(served), "prefill_log_s": phases}
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


def summarize(rows: list[dict], args: argparse.Namespace) -> dict:
    med = lambda key: round(statistics.median(r[key] for r in rows if r.get(key) is not None), 2)  # noqa: E731
    names = ["api_server_first_line"] + [name for name, _ in PHASES[1:]]
    return {"variant": rows[0]["variant"], "cycles": len(rows), "burst": args.burst,
            "front_end": "gateway" if args.gateway else "router",
            "lost": sum(r["lost"] for r in rows), "duplicated": sum(r["duplicated"] for r in rows),
            "decode_alone": sum(r["decode_alone"] for r in rows),
            "first_request_to_first_token_s_p50": med("first_token_s"),
            **{f"{k}_p50": med(k) for k in ("activation_s", "engine_start_s", "offer_s", "total_s")},
            "awake_request_ms_p50": med("awake_request_ms_p50") if args.after else None,
            "awake_lost": sum(args.after - r["awake_answered"] for r in rows),
            # the prefill engine's start, seconds after the runner started it (median; its log has whole seconds)
            "prefill_phases_s_p50": {name: statistics.median(r["prefill_log_s"][name] for r in rows
                                                             if name in r["prefill_log_s"])
                                     for name in names if any(name in r["prefill_log_s"] for r in rows)}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cycles", type=int, default=20, help="wakes per fleet")
    ap.add_argument("--burst", type=int, default=20)
    ap.add_argument("--gateway", action="store_true", help="through Envoy and the Endpoint Picker")
    ap.add_argument("--cr", type=Path, default=CR, help="the fleet (default %(default)s)")
    ap.add_argument("--no-launcher", action="store_true", help="engines started as fresh interpreters")
    ap.add_argument("--compare", action="store_true", help="before, launcher and after in this run (see above)")
    ap.add_argument("--after", type=int, default=10, help="sequential requests after each wake (default %(default)s)")
    args = ap.parse_args()
    summaries = []
    with tempfile.TemporaryDirectory(prefix="pdfleet-stz-cr-") as tmp:
        if args.compare:
            before = without_in_process_executor(args.cr, Path(tmp) / "before.yaml")
            variants = [("before", before, False), ("launcher", before, True), ("after", args.cr, True)]
        else:
            variants = [("launcher off" if args.no_launcher else "as is", args.cr, not args.no_launcher)]
        for name, cr, launcher in variants:
            summaries.append(summarize(run_fleet(args, name, cr, launcher), args))
            print("summary " + json.dumps(summaries[-1]), flush=True)
    if len(summaries) > 1:
        base = summaries[0]
        for s in summaries[1:]:
            print(f"{base['variant']} / {s['variant']} (p50): " + json.dumps(
                {k: round(base[k] / s[k], 2) for k in ("engine_start_s_p50", "first_request_to_first_token_s_p50",
                                                      "total_s_p50", "awake_request_ms_p50") if s.get(k)}), flush=True)
    return 1 if any(s["lost"] or s["duplicated"] or s["decode_alone"] or s["awake_lost"] for s in summaries) else 0


if __name__ == "__main__":
    raise SystemExit(main())
