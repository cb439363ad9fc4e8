"""A release request from the router (RELEASE_KEY, issue 20 row 6) inside a real vLLM 0.32 scheduler with the
prefill's real worker connector (NIXL/ZMQ source): the prefill frees its own unread lease at once, refuses
params that are not its own, and leaves a lease a reader claimed to its reader."""

from __future__ import annotations

import time

import pytest
from adapter_harness import BLOCK, Side, free_port, prefill_request, request, run_until, signed

from pdfleet.contract.kv_params import ERROR_KEY, RELEASE_KEY, release_request


@pytest.fixture()
def pair(tiny_model, monkeypatch):
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_port()))
    prefill = Side(tiny_model, "kv_producer", extra={"lease_seconds": 20})
    decode = Side(tiny_model, "kv_consumer", extra={"handshake_timeout": 1.0, "handshake_retries": 1})
    yield prefill, decode
    decode.close()
    prefill.close()


def _release(side: Side, kv_params: dict) -> dict:
    """Send a release request (as the router does: one prompt token, one output token); its answer's params."""
    req = request(1, kv_params, max_tokens=1, seed=99)
    side.add(req)
    run_until(side, lambda: req.request_id in side.outputs and side.outputs[req.request_id].finish_reason)
    return side.outputs[req.request_id].kv_transfer_params


def _stats(side: Side) -> dict:
    return side.worker._worker.cumulative_stats()


def test_the_router_release_frees_an_unread_lease_at_once(pair):
    prefill, _ = pair
    pid, params, _ = prefill_request(prefill, 3 * BLOCK + 5, seed=1)
    held = prefill.free_blocks()
    started = time.monotonic()
    assert _release(prefill, release_request(params)) == {RELEASE_KEY: True}
    run_until(prefill, lambda: pid not in prefill.scheduler.requests)  # lease 20 s: freed by the release
    assert time.monotonic() - started < 2.0
    assert prefill.free_blocks() > held
    stats = _stats(prefill)
    assert stats["leases_released_unread"] == 1 and stats["unread_releases_refused"] == 0
    assert stats.get("params_rejected", 0) == 0


def test_without_the_release_key_the_lease_is_held(pair):
    """Negative control: the same params sent back without RELEASE_KEY free nothing."""
    prefill, _ = pair
    pid, params, _ = prefill_request(prefill, 3 * BLOCK + 5, seed=2)
    answer = _release(prefill, dict(params))
    assert ERROR_KEY in answer  # a producer pulls nothing: computed locally
    for _ in range(20):
        prefill.step()
        time.sleep(0.01)
    assert pid in prefill.scheduler.requests  # still held
    assert _stats(prefill).get("leases_released_unread", 0) == 0


@pytest.mark.parametrize("alter, field", [
    (lambda p: {**p, "remote_request_id": "cmpl-someone-else"}, "pdfleet_signature"),  # signature broken
    (lambda p: signed({**p, "remote_engine_id": "another-prefill"}), "remote_engine_id"),  # signed, not ours
])
def test_params_that_are_not_its_own_release_nothing(pair, alter, field):
    prefill, _ = pair
    pid, params, _ = prefill_request(prefill, 2 * BLOCK, seed=3)
    answer = _release(prefill, release_request(alter(params)))
    assert field in answer[ERROR_KEY], answer
    for _ in range(20):
        prefill.step()
        time.sleep(0.01)
    assert pid in prefill.scheduler.requests
    assert _stats(prefill).get("leases_released_unread", 0) == 0


def test_a_lease_a_reader_claimed_is_left_to_its_reader(pair):
    """A decode that queued the request claimed the lease with its keep-alive heartbeat: the router's release
    does not cut it off, and the decode still pulls."""
    prefill, decode = pair
    n = 3 * BLOCK
    pid, params, _ = prefill_request(prefill, n, seed=4)
    dreq = request(n, dict(params), max_tokens=2, seed=4)
    decode.connector.on_new_request(dreq)  # queued on decode: its worker heartbeats the lease
    deadline = time.monotonic() + 5.0
    while _stats(prefill).get("heartbeats", 0) < 1 and time.monotonic() < deadline:
        decode.worker.bind_connector_metadata(decode.connector.build_connector_meta(None))
        decode.worker.start_load_kv(None)
        decode.worker.clear_connector_metadata()
        time.sleep(0.05)
    assert _stats(prefill)["heartbeats"] >= 1
    assert _release(prefill, release_request(params)) == {RELEASE_KEY: True}  # accepted by the scheduler ...
    prefill.step()
    stats = _stats(prefill)
    assert stats["unread_releases_refused"] == 1 and stats["leases_released_unread"] == 0  # ... not by the lease
    assert pid in prefill.scheduler.requests
    decode.scheduler.add_request(dreq)
    decode.step(write_kv=False)
    run_until(decode, lambda: dreq.status.name == "RUNNING", write_kv=False)
    dstats = decode.worker._worker.cumulative_stats()
    assert dstats.get("transfers", 0) == 1 and dstats.get("failures", 0) == 0
