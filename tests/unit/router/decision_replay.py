"""A recorded replay of routing decisions (issue 38): the same workload through the decision core,
whose every choice is written down, so that a change to how picking is built (filters -> scorers ->
picker) can be held to byte-identical decisions.

The workload: two revisions (a serving pair and a 30 % canary), prompts that share prefixes, load
that comes and goes (legs acquired and released out of order), ejected endpoints, retried legs (tried
sets), fan-out bodies, and both prefill policies under both disaggregation policies. Scoring runs
on both index paths: endpoints whose KV-event index is synced (exact block keys) and the router's own
record of what it sent where (text chunks). Tokenization is bytes -> ids: deterministic, no model.

``python tests/unit/router/decision_replay.py`` rewrites the recording (do it only when a decision
is meant to change, and say why in the commit).
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from pathlib import Path
from typing import Any

from pdfleet.connector.serving.endpoints import DECODE, PREFILL, Endpoint, RevisionEndpoints
from pdfleet.connector.serving.router_state import RouterState
from pdfleet.contract.router_config import RouterConfig
from pdfleet.contract.routing import (
    DISAGGREGATION_ALWAYS,
    DISAGGREGATION_CONDITIONAL,
    LEAST_OUTSTANDING,
    PREFIX_AWARE,
)

RECORDING = Path(__file__).parent / "data" / "decision_replay.json"
BLOCK = 16
PREFILLS = ("http://p0:8000", "http://p1:8000", "http://p2:8000")
DECODES = ("http://d0:8000", "http://d1:8000")
CANARY = (("http://cp0:8000",), ("http://cd0:8000",))
SYSTEMS = ["You are a helpful assistant. " * k for k in (3, 9, 20)]
TOPICS = ["the weather in Lisbon", "a proof that there are infinitely many primes", "how NIXL moves KV",
          "Kubernetes operators", "a haiku about routers", "the capital of Mongolia"]


def _tokenize(text: str) -> list[int]:
    return list(text.encode("utf-8"))


def _groups() -> list[RevisionEndpoints]:
    def ep(url: str, synced_events: bool) -> Endpoint:
        return Endpoint(url, kv_events=f"tcp://{url[7:].split(':')[0]}:5557" if synced_events else None)

    serving = RevisionEndpoints("r1", prefill=tuple(ep(u, i != 2) for i, u in enumerate(PREFILLS)),
                                decode=tuple(ep(u, i == 0) for i, u in enumerate(DECODES)), created=1.0,
                                serving=True)
    canary = RevisionEndpoints("r2", prefill=tuple(ep(u, True) for u in CANARY[0]),
                               decode=tuple(ep(u, True) for u in CANARY[1]), created=2.0, canary_weight=30)
    return [serving, canary]


def _workload(seed: int, n: int) -> list[dict[str, Any]]:
    rnd = random.Random(seed)
    out = []
    for _ in range(n):
        chat = rnd.random() < 0.4
        text = rnd.choice(SYSTEMS) + f"Tell me about {rnd.choice(TOPICS)}. " * rnd.randint(1, 4)
        if rnd.random() < 0.15:
            text = "short"
        body: dict[str, Any] = ({"model": "m", "messages": [{"role": "user", "content": text}]} if chat
                                else {"model": "m", "prompt": text})
        if rnd.random() < 0.1:
            body["n"] = 2
        out.append({"chat": chat, "body": body, "session": f"s{rnd.randint(0, 5)}" if rnd.random() < 0.5 else None,
                    "retry": rnd.random() < 0.2, "eject": rnd.random() < 0.08, "finish": rnd.randint(0, 3)})
    return out


async def _run(prefill_policy: str, disaggregation: str, workload: list[dict[str, Any]],
               max_imbalance: int = 4) -> list[list[Any]]:
    config = RouterConfig(prefill=PREFILLS, decode=DECODES, block_size=BLOCK, prefill_policy=prefill_policy,
                          decode_policy=prefill_policy, disaggregation_policy=disaggregation,
                          min_remote_prefill_tokens=48, prefill_busy_in_flight=2, eject_s=1e9,
                          prefix_max_imbalance=max_imbalance)
    state = RouterState(config)
    picker = state.picker
    from pdfleet.connector.serving.kvaware.prefix_routing import PrefixRouting

    picker.prefix = routing = PrefixRouting(config, state.metrics, tokenize=_tokenize, labels=picker.labels)
    picker.set_endpoints(_groups())
    for engine in routing.states.values():
        engine.synced = True  # as after the replay of its event stream
    held: list[tuple[str, str]] = []  # legs in flight: (role, url)
    out = []
    for k, step in enumerate(workload):
        body, chat = step["body"], step["chat"]
        headers = {"x-session-id": step["session"]} if step["session"] else {}
        pair = picker.choose_pair(body, chat=chat, request_id=f"req-{k}", headers=headers)
        decision = picker.decide(pair, body, chat=chat)
        row: list[Any] = [pair.revision, decision.header()]
        prefill = picker.pick(PREFILL, pair.ready(PREFILL), (), body, chat) if decision.remote else None
        row.append(prefill)
        if step["retry"] and prefill is not None:
            row.append(picker.pick(PREFILL, pair.ready(PREFILL), (prefill,), body, chat))
        decode = picker.pick(DECODE, pair.ready(DECODE), (), body, chat)
        row.append(decode)
        if step["eject"]:
            picker.eject(decode)
        for role, url in ((PREFILL, prefill), (DECODE, decode)):
            if url is not None:
                picker.acquire(role, url)
                held.append((role, url))
        # The engines' events now say the chosen ones hold this prompt's blocks.
        keys = list(routing.keys_for(body, chat).exact(routing.hasher))
        for url in (prefill, decode):
            if url is not None and url in routing.states:
                routing.states[url].index.hashes.update(keys)
        for _ in range(min(step["finish"], len(held))):  # some legs end, oldest-but-one first
            role, url = held.pop(1 if len(held) > 1 else 0)
            picker.release(role, url)
        await asyncio.sleep(0)
        await routing.settle()
        out.append(row)
    return out


def replay(max_imbalance: int = 4) -> dict[str, list[list[Any]]]:
    workload = _workload(38, 160)
    return {f"{p}/{d}": asyncio.run(_run(p, d, workload, max_imbalance))
            for p in (PREFIX_AWARE, LEAST_OUTSTANDING) for d in (DISAGGREGATION_ALWAYS, DISAGGREGATION_CONDITIONAL)}


def encoded(decisions: dict[str, list[list[Any]]]) -> bytes:
    return json.dumps(decisions, indent=0, sort_keys=True).encode()


if __name__ == "__main__":
    RECORDING.write_bytes(encoded(replay()))
    print(f"wrote {RECORDING} ({RECORDING.stat().st_size} bytes)", file=sys.stderr)
