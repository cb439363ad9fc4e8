"""The fault suite (`make chaos`): a `pdfleet local` fleet of 2 prefill and 1-2 decode engines under
steady load, one fault at a time, one row per fault (see tests/e2e/local/chaos_harness.py).

    flock /tmp/pdfleet-heavy.lock .venv/bin/python bench/chaos.py [--decode 2] [--only "prefill SIGTERM" ...]

A single plain vLLM server answers every prompt first (alone on the CPUs); the fleet's answers are
compared with it token by token. Prints the table and writes it as JSON (--out).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e" / "local"))
sys.path.insert(0, str(REPO / "tests" / "support"))  # the harness's zmtp_flood

from pdfleet.contract.connector_config import LEASE_SECONDS  # noqa: E402
from chaos_harness import SCENARIOS, ChaosFleet, fault_probes, format_table, run_scenario, write_report  # noqa: E402
from local_fleet import ask_all, model_dir, prompt_sets, reference_server  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--decode", type=int, default=2, help="decode engines (1 or 2)")
    ap.add_argument("--lease", type=int, default=20, help="kvTransfer.leaseSeconds of the fleet")
    ap.add_argument("--clients", type=int, default=3)
    ap.add_argument("--only", nargs="*", default=None, help="scenario names (default: all)")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "chaos-results.json")
    args = ap.parse_args()
    names = args.only or list(SCENARIOS)
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        ap.error(f"unknown scenarios {unknown}; known: {list(SCENARIOS)}")
    return asyncio.run(run(args, names))


async def run(args: argparse.Namespace, names: list[str]) -> int:
    work = Path(tempfile.mkdtemp(prefix="pdfleet-chaos-"))
    mdir = model_dir()
    prompts = prompt_sets(mdir)
    reqs = prompts.concurrent + prompts.kill
    probes = fault_probes(prompts)  # the prompts some rows send beside the load
    asked = reqs + [r for name in names for r in probes.get(name, [])]
    started = time.monotonic()
    (work / "reference").mkdir()
    with reference_server(work / "reference", mdir) as url:
        answers = await ask_all(url, asked, concurrency=4)
    reference = {r.label: a for r, a in zip(asked, answers)}
    assert all(a.status == 200 and a.token_ids for a in answers), "the reference server failed a prompt"
    print(f"reference: {len(asked)} prompts answered by a single server in {time.monotonic() - started:.0f}s",
          flush=True)
    cf = ChaosFleet(work / "fleet", prefill=2, decode=args.decode, lease=args.lease)
    rows = []
    try:
        await cf.start(warm=reqs[:8])
        print(f"fleet: 2 prefill + {args.decode} decode up after {time.monotonic() - started:.0f}s", flush=True)
        for name in names:
            t0 = time.monotonic()
            # The last fault's engine restart is not waited for (nothing comes after it).
            kwargs = {"probes": probes[name]} if name in probes else {}
            row, _ = await run_scenario(cf, name, reqs, reference, clients=args.clients, restore=name != names[-1],
                                        **kwargs)
            rows.append(row)
            print(f"{name}: done in {time.monotonic() - t0:.0f}s", flush=True)
            print(format_table([row]), flush=True)
    finally:
        await cf.close()
        print("\n" + format_table(rows), flush=True)  # also the rows done before a failure
    write_report(args.out, rows, {"decode": args.decode, LEASE_SECONDS: args.lease, "clients": args.clients})
    bad = [r.scenario for r in rows if r.lost or r.wrong]
    print(f"goals (nothing lost, nothing wrong): {'PASS' if not bad else 'FAIL: ' + ', '.join(bad)}")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
