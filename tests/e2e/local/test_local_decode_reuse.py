"""Decode's KV reused by the next turn's prefill (issue 40 part 3) on `pdfleet local`, ONE fleet: 1 prefill + 1
decode of the tiny model, spec.kvTransfer.decodeReuse on (minReusableTokens 64, both engines kv_both).

Five-turn conversations of token-id prompts (each turn: the last prompt, the last answer's token ids, a short user
message; the conversation named by the request's `user`), turns 1-4 answered whole, turn 5 streamed (a stream is
not asked to hold: nothing stays held at the end):
- long answers (100 tokens): each later turn's prefill pulls from the decode the blocks its own cache lacks, the
  previous answer's (prefill's vllm:prompt_tokens_cached_by_source{source="p2p"} grows by exactly what
  turn_reuse.tokens_to_pull says for those prompt lengths: 96 tokens a turn);
- negative control in the same fleet, short answers (40 tokens): one block to gain a turn, under the threshold:
  the prefill recomputes (p2p unchanged) and the decode's hold is released at once;
- the decode's leases all end (held = completed + released), none by expiry;
- every answer token-identical to a plain vLLM server (no P/D) given the same prompts, run after the fleet.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
import yaml

from pdfleet.connector.adapter.metric_names import exported_name
from pdfleet.connector.adapter.turn_reuse import tokens_to_pull
from local_fleet import BLOCK, MODEL, TINY_CR, Answer, Req, ask, corpus_ids, local_fleet, metric_sum, reference_server

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

MIN_TOKENS = 64
TURNS = 5
FIRST = 96  # three blocks
USER = 16
LONG, SHORT = 100, 40  # answer tokens: 96 tokens to pull a turn (three blocks), or 32 (one, under the threshold)
CONVERSATIONS = 2  # of each kind
P2P = "vllm:prompt_tokens_cached_by_source_total"


def reuse_cr(workdir: Path) -> Path:
    cr = yaml.safe_load(TINY_CR.read_text())
    cr["spec"]["kvTransfer"]["decodeReuse"] = {"enabled": True, "minReusableTokens": MIN_TOKENS}
    path = workdir / "decode-reuse-cr.yaml"
    path.write_text(yaml.safe_dump(cr))
    return path


def turn(label: str, prompt: list[int], answer_tokens: int, user: str, stream: bool) -> Req:
    return Req(label, "/v1/completions", {
        "model": MODEL, "prompt": prompt, "max_tokens": answer_tokens, "temperature": 0, "ignore_eos": True,
        "return_token_ids": True, "stream": stream, "user": user})


async def conversation(base: str, name: str, ids: list[int], answer_tokens: int) -> list[tuple[Req, Answer]]:
    """One conversation's turns in order; ``ids``: its first prompt and user messages."""
    out: list[tuple[Req, Answer]] = []
    prompt = ids[:FIRST]
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
        for t in range(TURNS):
            req = turn(f"{name} t{t + 1}", prompt, answer_tokens, name, stream=t == TURNS - 1)
            answer = await ask(client, base, req)
            assert answer.status == 200 and len(answer.token_ids) == answer_tokens, (req.label, answer)
            out.append((req, answer))
            user = ids[FIRST + USER * t:FIRST + USER * (t + 1)]
            prompt = prompt + answer.token_ids + user
    return out


def expected_pull(answer_tokens: int) -> int:
    """What the prefill pulls over one conversation's turns 2..5: per turn, the decode holds the last turn's
    computed full blocks (prompt + answer - 1 tokens), the prefill cached the last prompt's."""
    total, last = 0, FIRST
    for _ in range(1, TURNS):
        held_blocks = (last + answer_tokens - 1) // BLOCK
        prompt = last + answer_tokens + USER
        total += tokens_to_pull(held_blocks, block_size=BLOCK, num_prompt_tokens=prompt,
                                num_computed_tokens=(last // BLOCK) * BLOCK, min_tokens=MIN_TOKENS)
        last = prompt
    return total


def p2p(url: str) -> float:
    return metric_sum(httpx.get(url + "/metrics", timeout=10).text, P2P, source="p2p")


def leases(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {k: metric_sum(text, exported_name(k) + "_total") for k in
            ("leases_held", "leases_completed", "leases_released", "leases_released_unread", "leases_expired")}


def test_decode_reuse(tmp_path_factory, tiny_model_dir):
    assert expected_pull(LONG) == 4 * 96 and expected_pull(SHORT) == 0  # the workload is what the docstring says
    ids = corpus_ids(tiny_model_dir, 2 * CONVERSATIONS * (FIRST + USER * TURNS))
    per = FIRST + USER * TURNS
    work = tmp_path_factory.mktemp("decode-reuse")
    started = time.monotonic()
    with local_fleet(work, cr=reuse_cr(work)) as fleet:
        print(f"decode reuse e2e: fleet up in {time.monotonic() - started:.1f} s")
        prefill, decode = fleet.engine("prefill")["url"], fleet.engine("decode")["url"]
        base = fleet.router
        assert base is not None

        async def run(kind: str, answer_tokens: int, offset: int) -> list[tuple[Req, Answer]]:
            convs = await asyncio.gather(*(conversation(base, f"{kind}-{c}", ids[(offset + c) * per:(offset + c + 1) * per],
                                                        answer_tokens) for c in range(CONVERSATIONS)))
            return [x for conv in convs for x in conv]

        before = p2p(prefill)
        short = asyncio.run(run("short", SHORT, 0))  # negative control first: nothing to pull yet either way
        after_short = p2p(prefill)
        long = asyncio.run(run("long", LONG, CONVERSATIONS))
        after_long = p2p(prefill)
        time.sleep(1.0)  # the last completion notices and stats reach the metrics
        d = leases(decode)
    print(f"decode reuse e2e: p2p tokens on prefill: short {after_short - before:.0f}, long {after_long - after_short:.0f}"
          f" (expected {CONVERSATIONS * expected_pull(LONG)}); decode leases {d}")
    assert after_short == before, "under minReusableTokens the prefill must recompute"
    assert after_long - after_short == CONVERSATIONS * expected_pull(LONG)
    # every hold ended: read by a prefill, or released by one (under the threshold); none left to lapse
    holds = CONVERSATIONS * (TURNS - 1) * 2  # turns 1-4 of each conversation (turn 5 streams: no hold)
    assert d["leases_held"] == holds and d["leases_expired"] == 0
    assert d["leases_completed"] == CONVERSATIONS * (TURNS - 1)  # the long conversations' pulls
    assert d["leases_released"] + d["leases_released_unread"] == CONVERSATIONS * (TURNS - 1)
    # token identity: the same prompts on one plain server
    with reference_server(tmp_path_factory.mktemp("decode-reuse-ref"), tiny_model_dir) as ref:
        async def replay() -> list[Answer]:
            async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
                return list(await asyncio.gather(*(ask(client, ref, req) for req, _ in short + long)))
        reference = asyncio.run(replay())
    mismatched = [req.label for (req, got), want in zip(short + long, reference) if got.token_ids != want.token_ids]
    assert not mismatched, mismatched
