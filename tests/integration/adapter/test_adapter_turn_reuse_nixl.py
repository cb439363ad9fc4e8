"""Decode's KV reused by the next turn's prefill (issue 40, part 3), inside real vLLM 0.32 schedulers over
real NIXL and ZMQ: a kv_both decode holds a finished turn's blocks (prompt and generated tokens) with their
prefix-caching hashes; the next turn's prefill (kv_both) pulls the blocks whose hashes match its prompt, past
what it cached itself, and the decode frees them after the read; below the threshold nothing is pulled and
the hold is released at once; a forged offer is refused. Between turns the router's keep-alives extend the hold
past its lease (still pulled intact); without them it lapses (negative control)."""

from __future__ import annotations

import time

import pytest
import torch
from adapter_harness import BLOCK, EOS, Side, free_port, prefill_request, run_until

from vllm import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher
from vllm.v1.request import Request, RequestStatus

from pdfleet.contract import kv_params as K

GENERATED = 2 * BLOCK + 3  # the decode's answer: two more full blocks and a bit


@pytest.fixture()
def pair(tiny_model, monkeypatch):
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_port()))
    prefill = Side(tiny_model, "kv_both", extra={"lease_seconds": 20})
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_port()))
    decode = Side(tiny_model, "kv_both", extra={"lease_seconds": 20})
    yield prefill, decode
    decode.close()
    prefill.close()


LEASE = 1.5  # the decode's lease in the keep-alive tests: short, so that two leases pass in 3 s


@pytest.fixture()
def short_pair(tiny_model, monkeypatch):
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_port()))
    prefill = Side(tiny_model, "kv_both", extra={"lease_seconds": 20})
    monkeypatch.setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", str(free_port()))
    decode = Side(tiny_model, "kv_both", extra={"lease_seconds": LEASE})
    yield prefill, decode
    decode.close()
    prefill.close()


def _request(rid: str, tokens: list[int], params: dict, max_tokens: int) -> Request:
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    sp.update_from_generation_config({}, EOS)
    r = Request(request_id=rid, prompt_token_ids=list(tokens), sampling_params=sp, pooling_params=None,
                block_hasher=get_request_block_hasher(BLOCK, sha256))
    r.kv_transfer_params = params
    return r


def _first_turn(prefill: Side, decode: Side, n: int, seed: int) -> tuple[Request, dict, dict[str, torch.Tensor]]:
    """Turn 1 through P/D with the router's ask to hold; the decode's offer and its held blocks' KV."""
    pid, params, _ = prefill_request(prefill, n, seed=seed)
    tokens = [(seed * 131 + i * 17) % 400 + 10 for i in range(n)]  # prefill_request's prompt (harness.request)
    dreq = _request(f"turn1-{seed}", tokens, K.hold_for_next_turn(params), GENERATED)
    decode.add(dreq)
    run_until(decode, lambda: (o := decode.outputs.get(dreq.request_id)) is not None and o.finish_reason is not None)
    offer = decode.outputs[dreq.request_id].kv_transfer_params
    assert K.reuse_offer(offer), offer
    decode.step()  # delivers the hold to the worker
    held = offer[K.REMOTE_BLOCK_IDS][0]
    snapshot = {name: t[held].clone() for name, t in decode.kv.items()}
    return dreq, offer, snapshot


def _next_turn(dreq: Request, extra: int) -> list[int]:
    return list(dreq.prompt_token_ids) + list(dreq.output_token_ids) + [(i * 29) % 300 + 20 for i in range(extra)]


def test_next_turn_pulls_the_history_from_decode(pair):
    prefill, decode = pair
    n = 3 * BLOCK + 5
    dreq, offer, held_kv = _first_turn(prefill, decode, n, seed=11)
    held = offer[K.REMOTE_BLOCK_IDS][0]
    # Prompt and generated tokens: every full block the decode computed, one hash each, both signatures.
    assert len(held) == (n + GENERATED - 1) // BLOCK == len(offer[K.REUSE_BLOCK_HASHES])
    assert offer[K.REUSE_BLOCK_HASHES] == [h.hex() for h in dreq.block_hashes[:len(held)]]
    assert K.SIG_KEY in offer and K.REUSE_SIG_KEY in offer
    assert decode.connector._scheduler.reuse_holds == 1
    # Turn 2 on the prefill: the history, then a new user message; prefill cached turn 1's prompt itself.
    tokens = _next_turn(dreq, 40)
    preq = _request("turn2", tokens, {K.DO_REMOTE_DECODE: True, **K.reuse_request(offer, BLOCK)}, 1)
    prefill.add(preq)
    prefill.step(write_kv=False)
    assert preq.status == RequestStatus.WAITING_FOR_REMOTE_KVS
    run_until(prefill, lambda: (o := prefill.outputs.get("turn2")) is not None and o.finish_reason is not None,
              write_kv=False)
    p_blocks = prefill.block_ids("turn2") if "turn2" in prefill.scheduler.requests else None
    assert p_blocks is not None  # held for its own decode
    local = n // BLOCK  # what prefill had cached of turn 1's prompt
    for i in range(local, len(held)):
        for name in prefill.kv:
            assert torch.equal(prefill.kv[name][p_blocks[i]], held_kv[name][i]), (name, i)
    stats = prefill.worker._worker.cumulative_stats()
    assert stats["transfers"] == 1
    # The same request still produces for its own decode.
    out = prefill.outputs["turn2"].kv_transfer_params
    assert out[K.DO_REMOTE_PREFILL] is True and K.REUSE_BLOCK_HASHES not in out
    # The decode frees the blocks after the read: its hold ends by the reader's completion.
    run_until(decode, lambda: dreq.request_id not in decode.scheduler.requests)
    assert decode.connector._scheduler.reuse_holds == 0
    d_stats = decode.worker._worker.cumulative_stats()
    assert d_stats["leases_held"] == 1 and d_stats["leases_completed"] == 1


def test_below_the_threshold_recomputes_and_releases_the_hold(pair):
    prefill, decode = pair
    dreq, offer, _ = _first_turn(prefill, decode, 3 * BLOCK + 5, seed=12)
    tokens = _next_turn(dreq, 10)
    # Negative control: the same offer, a threshold above what it could save.
    preq = _request("turn2-small", tokens, {K.DO_REMOTE_DECODE: True, **K.reuse_request(offer, 100 * BLOCK)}, 1)
    prefill.add(preq)
    prefill.step()
    assert preq.status != RequestStatus.WAITING_FOR_REMOTE_KVS
    run_until(prefill, lambda: (o := prefill.outputs.get("turn2-small")) is not None and o.finish_reason is not None)
    assert prefill.worker._worker.cumulative_stats().get("transfers", 0) == 0
    run_until(decode, lambda: dreq.request_id not in decode.scheduler.requests)  # released, not left to lapse
    assert decode.worker._worker.cumulative_stats()["leases_released"] == 1


def test_a_forged_offer_is_refused_and_the_turn_computed(pair):
    prefill, decode = pair
    dreq, offer, _ = _first_turn(prefill, decode, 3 * BLOCK + 5, seed=13)
    forged = dict(offer)
    hashes = list(forged[K.REUSE_BLOCK_HASHES])
    hashes[-1] = "00" * 32  # claims other tokens for the last block: the reuse signature no longer holds
    forged[K.REUSE_BLOCK_HASHES] = hashes
    preq = _request("turn2-forged", _next_turn(dreq, 40), {K.DO_REMOTE_DECODE: True,
                                                           **K.reuse_request(forged, BLOCK)}, 1)
    prefill.add(preq)
    prefill.step()
    assert preq.status != RequestStatus.WAITING_FOR_REMOTE_KVS
    run_until(prefill, lambda: (o := prefill.outputs.get("turn2-forged")) is not None and o.finish_reason is not None)
    assert prefill.worker._worker.cumulative_stats().get("transfers", 0) == 0
    # still produced for its own decode, and the decode's hold (v3-signed) released at once
    assert prefill.outputs["turn2-forged"].kv_transfer_params[K.DO_REMOTE_PREFILL] is True
    run_until(decode, lambda: dreq.request_id not in decode.scheduler.requests)
    assert decode.worker._worker.cumulative_stats()["leases_released"] == 1


def test_no_hold_without_the_routers_ask(pair):
    prefill, decode = pair
    pid, params, _ = prefill_request(prefill, 2 * BLOCK + 1, seed=14)
    tokens = [(14 * 131 + i * 17) % 400 + 10 for i in range(2 * BLOCK + 1)]
    dreq = _request("plain", tokens, dict(params), 4)
    decode.add(dreq)
    run_until(decode, lambda: (o := decode.outputs.get("plain")) is not None and o.finish_reason is not None)
    assert decode.outputs["plain"].kv_transfer_params is None
    assert decode.connector._scheduler.reuse_holds == 0


def _keep_alive(decode: Side, offers: list[dict], rid: str) -> list[str]:
    """The router's keep-alive (a one-token request naming the offers); the decode's verdicts."""
    decode.add(_request(rid, [5], K.keep_alive_request(offers), 1))
    run_until(decode, lambda: (o := decode.outputs.get(rid)) is not None and o.finish_reason is not None)
    return decode.outputs[rid].kv_transfer_params[K.KEEP_ALIVE_KEY]


def _between_turns(decode: Side, seconds: float, offer: dict | None) -> list[str]:
    """The decode runs for ``seconds``; with ``offer``, kept alive every third of its lease, as the router does."""
    verdicts: list[str] = []
    end = last = time.monotonic()
    end += seconds
    while time.monotonic() < end:
        if offer is not None and time.monotonic() - last >= LEASE / 3:
            last = time.monotonic()
            verdicts += _keep_alive(decode, [offer], f"ka-{len(verdicts)}")
        decode.step()
        time.sleep(0.02)
    return verdicts


def _pull_turn2(prefill: Side, dreq: Request, offer: dict, rid: str) -> None:
    preq = _request(rid, _next_turn(dreq, 40), {K.DO_REMOTE_DECODE: True, **K.reuse_request(offer, BLOCK)}, 1)
    prefill.add(preq)
    run_until(prefill, lambda: (o := prefill.outputs.get(rid)) is not None and o.finish_reason is not None,
              write_kv=False)


def test_a_hold_kept_alive_outlives_its_lease_and_is_pulled_intact(short_pair):
    prefill, decode = short_pair
    n = 3 * BLOCK + 5
    dreq, offer, held_kv = _first_turn(prefill, decode, n, seed=21)
    assert offer[K.REMOTE_LEASE_SECONDS] == LEASE
    verdicts = _between_turns(decode, 2 * LEASE, offer)
    assert len(verdicts) >= 4 and set(verdicts) == {K.KEPT}
    # per offer: another decode's offer in the same request is refused, naming why; this one is kept
    other = dict(offer, **{K.REMOTE_ENGINE_ID: "decode-elsewhere"})
    mixed = _keep_alive(decode, [other, offer], "ka-mixed")
    assert mixed[1] == K.KEPT and K.REMOTE_ENGINE_ID in mixed[0]
    sched = decode.connector._scheduler
    assert sched.keep_alives_refused == 1 and sched.reuse_holds == 1
    d_stats = decode.worker._worker.cumulative_stats()
    assert d_stats["leases_expired"] == 0
    _pull_turn2(prefill, dreq, offer, "turn2-kept")
    p_blocks = prefill.block_ids("turn2-kept")
    held = offer[K.REMOTE_BLOCK_IDS][0]
    for i in range(n // BLOCK, len(held)):
        for name in prefill.kv:
            assert torch.equal(prefill.kv[name][p_blocks[i]], held_kv[name][i]), (name, i)
    assert prefill.worker._worker.cumulative_stats()["transfers"] == 1
    run_until(decode, lambda: dreq.request_id not in decode.scheduler.requests)
    assert decode.worker._worker.cumulative_stats()["leases_completed"] == 1


def test_without_keep_alives_the_hold_lapses(short_pair):
    """Negative control: the same turns and wait, nobody keeps the hold alive."""
    prefill, decode = short_pair
    dreq, offer, _ = _first_turn(prefill, decode, 3 * BLOCK + 5, seed=22)
    assert _between_turns(decode, 2 * LEASE, None) == []
    assert decode.worker._worker.cumulative_stats()["leases_expired"] == 1
    assert decode.connector._scheduler.reuse_holds == 0
    late = _keep_alive(decode, [offer], "ka-late")  # too late: never revived
    assert late != [K.KEPT] and "no hold" in late[0]
    _pull_turn2(prefill, dreq, offer, "turn2-lapsed")
    assert prefill.worker._worker.cumulative_stats().get("transfers", 0) == 0
