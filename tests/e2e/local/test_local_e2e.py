"""`pdfleet local` end to end on CPU: 1 prefill + 1 decode (pdfleet's connector) behind the router,
token-identical to a single vLLM server, a decode retry that reuses prefill's KV, under
concurrency, with a negative control (decode's test-only fault hook corrupts what it pulls: the
comparison must catch it), through a prefill crash, and no process left behind after SIGTERM. One
fleet for the whole module; the reference server ran
before it (never beside it: engines on shared cores slow each other down)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx
import psutil
import pytest

import yaml

from local_fleet import (
    BLOCK, REUSE_CONVERSATIONS, REUSE_FIRST, REUSE_LONG, REUSE_MIN_TOKENS, REUSE_SHORT, REUSE_TURNS, REUSE_USER,
    MODEL, TINY_CR, Answer, Req, ask, ask_all, local_fleet, metric_sum, reuse_conversations, reuse_turns, transferred_tokens,
)
from pdfleet.connector.adapter.metric_names import exported_name
from pdfleet.connector.adapter.turn_reuse import tokens_to_pull
from observability_assets import all_queries, split_by_source
from pdfleet.connector.router.app import ROUTER_KEY, start_router
from pdfleet.contract.env import TEST_CORRUPT_PULLED_BLOCKS
from pdfleet.contract.router_config import RouterConfig
from pdfleet.contract.routing import LEAST_OUTSTANDING
from pdfleet.operator.local.processes import reserve_ports
from pdfleet.operator.observability.promql import exported_names, missing_metrics

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def router_port():
    return reserve_ports(1)[0]


@pytest.fixture(scope="module")
def corrupt_flag(tmp_path_factory) -> Path:
    """While this file exists, decode corrupts the blocks it pulls (the test-only fault hook)."""
    return tmp_path_factory.mktemp("corrupt") / "on"


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, reference, router_port, corrupt_flag):  # `reference` first: its server is gone before
    # Dev mode: POST /reset_prefix_cache, so the negative control pulls again what decode cached.
    env = {TEST_CORRUPT_PULLED_BLOCKS: str(corrupt_flag), "VLLM_SERVER_DEV_MODE": "1"}
    work = tmp_path_factory.mktemp("fleet")
    cr = yaml.safe_load(TINY_CR.read_text())  # decode's KV reused by the next turn: only conversations use it
    cr["spec"]["kvTransfer"]["decodeReuse"] = {"enabled": True, "minReusableTokens": REUSE_MIN_TOKENS}
    (work / "cr.yaml").write_text(yaml.safe_dump(cr))
    with local_fleet(work, cr=work / "cr.yaml", env=env, extra_args=("--router-port", str(router_port))) as f:
        yield f


def differences(reqs: list[Req], answers: list[Answer], reference: dict[str, Answer], *, pd_only: bool = True):
    """Human-readable problems: HTTP errors, fallbacks (when P/D is required), token mismatches."""
    problems = []
    for req, got in zip(reqs, answers):
        ref = reference[req.label]
        if got.status != 200 or got.error:
            problems.append(f"{req.label}: HTTP {got.status} {got.error or got.text[:200]}")
        elif pd_only and got.fallback:
            problems.append(f"{req.label}: served without P/D ({got.fallback})")
        elif got.token_ids != ref.token_ids or got.text != ref.text:
            problems.append(f"{req.label}: {got.token_ids} != reference {ref.token_ids}")
    return problems


def test_router_line_is_printed_once(fleet, router_port):
    assert [l for l in fleet.stdout_lines if l.startswith("router:")] == [f"router: {fleet.router}"]
    assert fleet.router == f"http://127.0.0.1:{router_port}"  # --router-port
    state = fleet.state()
    assert state["healthy"] and state["router"] == fleet.router
    assert {e["role"] for e in state["engines"]} == {"prefill", "decode"}
    # Each engine pinned to its own CPUs.
    cpus = [set(c for rank in e["cpus"] for c in rank) for e in state["engines"]]
    if len(os.sched_getaffinity(0)) >= 2:
        assert not cpus[0] & cpus[1]


async def _retry_through_a_dead_decode(fleet, req: Req, *, lease_margin_s: float) -> tuple[Answer, dict]:
    """One request through an in-process router whose first decode is dead (nothing listens: the
    leg fails before its first byte) and whose second is the fleet's decode; what moved, counted."""
    prefill, decode = fleet.engine("prefill")["url"], fleet.engine("decode")["url"]
    dead = f"http://127.0.0.1:{reserve_ports(1)[0]}"
    # leastOutstanding over (dead, decode) with no ejection: the first pick is the dead one, the retry the live one.
    config = RouterConfig(prefill=(prefill,), decode=(dead, decode), prefill_policy=LEAST_OUTSTANDING,
                          decode_policy=LEAST_OUTSTANDING, eject_s=0, lease_margin_s=lease_margin_s)
    runner, port = await start_router(config, "127.0.0.1", 0)
    try:
        prefills_before = metric_sum(httpx.get(prefill + "/metrics", timeout=10).text, "vllm:request_success_total")
        pulled_before = transferred_tokens(decode)
        async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
            answer = await ask(client, f"http://127.0.0.1:{port}", req)
            await runner.app[ROUTER_KEY].releases.settle()  # a lease release it sent has been answered
            # the router runs in this event loop: never a blocking call to it
            router_metrics = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
        releases = metric_sum(router_metrics, "pdfleet_router_kv_releases_total", outcome="accepted")
        moved = {
            # a release the router sends is a one-token request at the prefill, not a prefill leg
            "prefill_legs": metric_sum(httpx.get(prefill + "/metrics", timeout=10).text,
                                       "vllm:request_success_total") - prefills_before - releases,
            "released": releases,
            "pulled_tokens": transferred_tokens(decode) - pulled_before,
            "decode_retries": metric_sum(router_metrics, "pdfleet_router_retries_total", leg="decode"),
            "dead_failures": metric_sum(router_metrics, "pdfleet_router_leg_failures_total", leg="decode",
                                        reason="connect"),
        }
    finally:
        await runner.cleanup()
    return answer, moved


async def test_a_decode_retry_reuses_prefills_kv(fleet, prompts, reference):
    """The lease-reuse fix end to end: a decode leg that fails before its first byte is retried on
    another decode with the same prefill's kv_transfer_params (the router reads the lease the
    connector writes), so the retry pulls prefill's KV: one prefill leg, output token-identical.
    Runs before the other tests, so that decode has not cached these prompts itself."""
    by_label = {r.label: r for r in prompts.identity}
    reuse, control = by_label["500 tokens"], by_label["200 tokens"]

    answer, moved = await _retry_through_a_dead_decode(fleet, reuse, lease_margin_s=1.0)
    assert differences([reuse], [answer], reference) == []  # P/D (no fallback header) and token-identical
    assert moved["dead_failures"] == 1 and moved["decode_retries"] == 1, moved
    assert moved["prefill_legs"] == 1, moved  # no second prefill leg
    assert moved["released"] == 0, moved  # the retried decode read the lease: nothing to release
    assert moved["pulled_tokens"] >= 15 * 32, moved  # the 500-token prompt's 15 full blocks came from prefill

    # Negative control: a lease margin longer than any lease makes the router refuse reuse (what it
    # did for every retry before the fix): decode computes alone, pulls nothing, and says so.
    answer, moved = await _retry_through_a_dead_decode(fleet, control, lease_margin_s=1e9)
    assert differences([control], [answer], reference, pd_only=False) == []
    assert answer.fallback == "decode-only", answer
    assert moved["decode_retries"] == 1 and moved["prefill_legs"] == 1 and moved["pulled_tokens"] == 0, moved
    assert moved["released"] == 1, moved  # ... and hands the lease it will not read back to the prefill (issue 20)


async def test_prompts_are_token_identical_to_a_single_server(fleet, prompts, reference):
    decode = fleet.engine("decode")["url"]
    before = transferred_tokens(decode)
    answers = await ask_all(fleet.router, prompts.identity, concurrency=1)
    assert len(prompts.identity) >= 20
    assert differences(prompts.identity, answers, reference) == []
    # The KV cache really moved: the 1000-token prompt alone brings 31 full blocks.
    assert transferred_tokens(decode) - before >= 31 * 32


async def test_32_concurrent_requests_are_all_correct(fleet, prompts, reference):
    answers = await ask_all(fleet.router, prompts.concurrent, concurrency=32)
    assert len(prompts.concurrent) == 32
    assert differences(prompts.concurrent, answers, reference) == []


MULTI_BLOCK = ("65 tokens", "100 tokens", "200 tokens", "500 tokens", "1000 tokens")


def reset_prefix_cache(url: str, timeout: float = 30.0) -> None:
    """Until vLLM says it is done: it refuses while blocks are held, and the blocks of holds already read (a
    kv_both decode's reuse offers) are freed at the engine's next step, which an idle engine takes on a request.
    A block never freed fails here."""
    deadline = time.monotonic() + timeout
    while True:
        reply = httpx.post(url + "/reset_prefix_cache", timeout=30)
        assert reply.status_code == 200, reply.text
        if reply.json().get("success"):
            return
        assert time.monotonic() < deadline, f"{url}: the prefix cache still holds blocks after {timeout:g}s"
        httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": [1, 2, 3], "max_tokens": 1}, timeout=30)
        time.sleep(0.2)


def expected_pull(answer_tokens: int) -> int:
    """What the prefill pulls over one reuse conversation's turns 2..5: per turn, the decode holds the last
    turn's computed full blocks (prompt + answer - 1 tokens), the prefill cached the last prompt's."""
    total, last = 0, REUSE_FIRST
    for _ in range(1, REUSE_TURNS):
        held_blocks = (last + answer_tokens - 1) // BLOCK
        prompt = last + answer_tokens + REUSE_USER
        total += tokens_to_pull(held_blocks, block_size=BLOCK, num_prompt_tokens=prompt,
                                num_computed_tokens=(last // BLOCK) * BLOCK, min_tokens=REUSE_MIN_TOKENS)
        last = prompt
    return total


def _p2p(url: str) -> float:
    return metric_sum(httpx.get(url + "/metrics", timeout=10).text, "vllm:prompt_tokens_cached_by_source_total",
                      source="p2p")


def _leases(url: str) -> dict[str, float]:
    text = httpx.get(url + "/metrics", timeout=10).text
    return {k: metric_sum(text, exported_name(k) + "_total") for k in
            ("leases_held", "leases_completed", "leases_released", "leases_released_unread", "leases_expired")}


def test_the_next_turns_prefill_reuses_decodes_kv(fleet, tiny_model_dir, reference):
    """Issue 40 part 3 on this fleet (spec.kvTransfer.decodeReuse on, minReusableTokens 64; both engines
    kv_both): five-turn conversations (local_fleet.reuse_conversation). Long answers (100 tokens): each later
    turn's prefill pulls from the decode the blocks its own cache lacks, the previous answer's: prefill's
    p2p-cached tokens grow by exactly what turn_reuse.tokens_to_pull says (96 a turn). Negative control, short
    answers (40 tokens, one block to gain a turn, under the threshold): recomputed, p2p unchanged, the decode's
    hold released at once. Every decode lease ends (none by expiry); every turn is token-identical to the plain
    server, which ran the same conversations (conftest's `reference`)."""
    assert expected_pull(REUSE_LONG) == 4 * 96 and expected_pull(REUSE_SHORT) == 0  # the workload as described
    convs = reuse_conversations(tiny_model_dir)
    prefill, decode = fleet.engine("prefill")["url"], fleet.engine("decode")["url"]
    before, leases_before = _p2p(prefill), _leases(decode)
    short = asyncio.run(reuse_turns(fleet.router, convs[:REUSE_CONVERSATIONS]))  # first: nothing pulled yet anyway
    after_short = _p2p(prefill)
    long = asyncio.run(reuse_turns(fleet.router, convs[REUSE_CONVERSATIONS:]))
    after_long = _p2p(prefill)
    time.sleep(1.0)  # the last completion notices and stats reach the metrics
    d = {k: v - leases_before[k] for k, v in _leases(decode).items()}
    print(f"decode reuse: p2p tokens on prefill: short {after_short - before:.0f}, long {after_long - after_short:.0f}"
          f" (expected {REUSE_CONVERSATIONS * expected_pull(REUSE_LONG)}); decode leases {d}")
    problems = differences([r for r, _ in short + long], [a for _, a in short + long], reference)
    assert not problems and len(short + long) == 2 * REUSE_CONVERSATIONS * REUSE_TURNS, problems
    assert after_short == before, "under minReusableTokens the prefill must recompute"
    assert after_long - after_short == REUSE_CONVERSATIONS * expected_pull(REUSE_LONG)
    # every hold ended: read by a prefill, or released (under the threshold); none left to lapse
    assert d["leases_held"] == 2 * REUSE_CONVERSATIONS * (REUSE_TURNS - 1) and d["leases_expired"] == 0
    assert d["leases_completed"] == REUSE_CONVERSATIONS * (REUSE_TURNS - 1)  # the long conversations' pulls
    assert d["leases_released"] + d["leases_released_unread"] == REUSE_CONVERSATIONS * (REUSE_TURNS - 1)


async def test_negative_control_corrupted_kv_is_caught(fleet, prompts, reference, corrupt_flag):
    """With decode's fault hook on, answers still come back 200 through P/D, and the token comparison of
    the tests above catches them: it can fail."""
    reqs = [r for r in prompts.identity if r.label in MULTI_BLOCK]
    decode = fleet.engine("decode")["url"]
    reset_prefix_cache(decode)  # else decode serves these prompts from its own cache and pulls nothing
    corrupt_flag.touch()
    try:
        before = transferred_tokens(decode)
        answers = await ask_all(fleet.router, reqs, concurrency=1)
        moved = transferred_tokens(decode) - before
    finally:
        corrupt_flag.unlink()
        reset_prefix_cache(decode)  # no corrupted block may serve a later test from decode's cache
    assert [a.status for a in answers] == [200] * len(reqs)
    assert [a.fallback for a in answers] == [None] * len(reqs)  # P/D served them
    assert moved > 0
    wrong = [r.label for r, a in zip(reqs, answers) if a.token_ids != reference[r.label].token_ids]
    assert len(wrong) >= len(reqs) - 1, wrong
    assert differences(reqs, answers, reference) != []  # the helper the tests above use reports them


async def test_dashboard_and_alert_metrics_exist_on_the_fleets_metrics_pages(fleet, prompts):
    # The real /metrics of both engines and of the router, after a request of several KV blocks.
    # Every metric the dashboard and the alert rules query, except the operator's (checked in
    # tests/integration/operator/test_operator_command.py), is exported by one of them.
    (answer,) = await ask_all(fleet.router, [r for r in prompts.identity if r.label == "200 tokens"], concurrency=1)
    assert answer.status == 200 and not answer.fallback, answer
    pages = {e["name"]: httpx.get(e["url"] + "/metrics", timeout=10).text for e in fleet.state()["engines"]}
    pages["router"] = httpx.get(fleet.router + "/metrics", timeout=10).text
    exported = set().union(*(exported_names(text) for text in pages.values()))
    queries = all_queries()
    _, fleet_missing = split_by_source(missing_metrics(queries, exported))
    assert fleet_missing == {}
    # The check can fail: a misspelled name in a query is reported, with where it is used.
    where, expr = next((w, e) for w, e in queries if "vllm:kv_cache_usage_perc" in e)
    broken = [(where, expr.replace("vllm:kv_cache_usage_perc", "vllm:kv_cache_usage_percent"))]
    assert missing_metrics(broken, exported) == {"vllm:kv_cache_usage_percent": [where]}
    # Data, not only declarations: decode pulled bytes, the router counted the requests.
    decode = pages[fleet.engine("decode")["name"]]
    assert metric_sum(decode, "vllm:pdfleet_connector_pull_bytes_total") > 0
    assert metric_sum(pages["router"], "pdfleet_router_requests_total", code="200") > 0


async def test_prefill_killed_mid_run_loses_no_request(fleet, prompts, reference):
    prefill = fleet.engine("prefill")
    done = 0
    killed_after = None

    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as client:
        sem = asyncio.Semaphore(4)

        async def one(req: Req) -> Answer:
            nonlocal done, killed_after
            async with sem:
                answer = await ask(client, fleet.router, req)
            done += 1
            if done == 8 and killed_after is None:
                killed_after = done
                os.killpg(prefill["pgid"], signal.SIGKILL)  # the pod dies: API server, engine core, workers
            return answer

        answers = await asyncio.gather(*(one(r) for r in prompts.kill))
    assert killed_after == 8 < len(prompts.kill)
    # Every request answered, and answered right (P/D where prefill was alive, decode alone after).
    assert differences(prompts.kill, answers, reference, pd_only=False) == []
    assert any(a.fallback for a in answers), "prefill was dead for the later requests: expected fallbacks"

    # The runner restarts prefill (like a StatefulSet); decode must hand-shake with the new
    # instance instead of reading from the dead one's stale agent.
    deadline = time.monotonic() + 420
    while time.monotonic() < deadline:
        state = fleet.state()
        engine = next(e for e in state["engines"] if e["role"] == "prefill")
        if engine["restarts"] == 1 and state["healthy"]:
            break
        await asyncio.sleep(1)
    else:
        pytest.fail(f"prefill not restarted and healthy; runner stderr:\n{fleet.stderr()[-3000:]}")
    assert engine["pid"] != prefill["pid"]
    decode = fleet.engine("decode")["url"]
    before = transferred_tokens(decode)
    answers = await ask_all(fleet.router, prompts.after_restart, concurrency=1)
    assert differences(prompts.after_restart, answers, reference) == []
    assert transferred_tokens(decode) - before >= 9 * 32  # 300 tokens: 9 full blocks came from the new prefill


def test_sigterm_stops_every_child(fleet):
    runner = psutil.Process(fleet.proc.pid)
    family = runner.children(recursive=True)
    groups = {e["pgid"] for e in fleet.state()["engines"]}
    # API servers, engine cores, workers and the watchdog at least.
    assert len(family) >= 5, [p.cmdline()[:3] for p in family]
    fleet.proc.send_signal(signal.SIGTERM)
    assert fleet.proc.wait(120) == 0
    gone, alive = psutil.wait_procs(family, timeout=30)
    assert alive == [], [(p.pid, p.cmdline()[:4]) for p in alive]
    leftover = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) in groups:
                leftover.append(p.pid)
        except (ProcessLookupError, PermissionError):
            pass
    assert leftover == []
