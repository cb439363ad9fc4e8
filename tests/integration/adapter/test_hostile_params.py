"""Issue 19 rows 5 and 11 (and row 4's "dial any host"): kv_transfer_params from a client, against vLLM's
real scheduler-side types. A prefill's SchedulerSide produces (and signs) the params; a decode's refuses
any it did not sign, with the reason named, and frees the prefill's blocks where it may."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from pdfleet.connector.adapter.config import parse_adapter_config
from pdfleet.connector.adapter.scheduler import SchedulerSide

BLOCK = 16


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "fleet-key"
    path.write_bytes(b"k" * 32)
    return str(path)


def side(key_file: str, *, producer: bool, tp: int = 1) -> SchedulerSide:
    cfg = parse_adapter_config({"auth_secret_file": key_file},
                               env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.0.0.7", "VLLM_NIXL_SIDE_CHANNEL_PORT": "5600"})
    return SchedulerSide(cfg=cfg, engine_id="prefill-0" if producer else "decode-0", block_size=BLOCK, tp_size=tp,
                         is_producer=producer, is_consumer=not producer)


def produced(prefill: SchedulerSide, rid: str, blocks: list[int], n_tokens: int) -> dict:
    from vllm.v1.request import RequestStatus

    req = SimpleNamespace(request_id=rid, kv_transfer_params={"do_remote_decode": True},
                          status=RequestStatus.FINISHED_LENGTH_CAPPED, num_computed_tokens=n_tokens)
    delay, params = prefill.request_finished(req, blocks)
    assert delay and params is not None
    return params


def decode_verdict(decode: SchedulerSide, rid: str, params: dict, n_tokens: int) -> tuple[int, str | None]:
    """(tokens the decode would pull, the refusal reason or None)."""
    req = SimpleNamespace(request_id=rid, kv_transfer_params=params, num_prompt_tokens=n_tokens,
                          status=None, num_computed_tokens=0)
    count, _ = decode.get_num_new_matched_tokens(req, 0)
    return count, decode._rejected.get(rid)


def test_row5_swapped_block_ids_or_host_are_refused_because_the_prefill_signed_them(key_file):
    prefill, decode = side(key_file, producer=True), side(key_file, producer=False)
    n = 3 * BLOCK
    mine = produced(prefill, "tenant-a", [0, 1, 2], n)
    theirs = produced(prefill, "tenant-b", [7, 8, 9], n)
    assert "pdfleet_signature" in mine
    # Negative control: the params as the prefill returned them are accepted.
    assert decode_verdict(decode, "ok", dict(mine), n) == (n, None)
    attacks = {
        "swapped block ids": {**mine, "remote_block_ids": theirs["remote_block_ids"]},
        "another host (row 4)": {**mine, "remote_host": "169.254.169.254", "remote_port": 80},
        "longer lease": {**mine, "remote_lease_seconds": mine["remote_lease_seconds"] + 600},
        "a wall-clock expiry added": {**mine, "remote_lease_expiry": time.time() + 600},
        "passed off as 1.2": {**mine, "pdfleet_params_version": "1.2"},
        "signature removed": {k: v for k, v in mine.items() if k != "pdfleet_signature"},
        "signature of another request": {**mine, "pdfleet_signature": theirs["pdfleet_signature"]},
        "garbage signature": {**mine, "pdfleet_signature": "v1.zz.zz"},
    }
    for name, params in attacks.items():
        count, reason = decode_verdict(decode, f"attack-{name}", params, n)
        print(f"row 5: {name}: pulls {count} tokens; {reason}")
        assert count == 0, name
        assert reason is not None and "kv_transfer_params.pdfleet_signature" in reason, name
    # A key the decode does not have: refused too.
    other = tmp_key = key_file + ".other"
    open(tmp_key, "wb").write(b"z" * 32)
    foreign = produced(side(other, producer=True), "tenant-c", [3, 4, 5], n)
    assert decode_verdict(decode, "foreign", foreign, n)[1] is not None


def test_row11_absurd_expiry_and_a_million_block_ids_are_refused_at_once_and_refused_signed_params_release(
        key_file):
    prefill, decode = side(key_file, producer=True), side(key_file, producer=False)
    n = 3 * BLOCK
    good = produced(prefill, "r1", [0, 1, 2], n)
    count, reason = decode_verdict(decode, "far", {**good, "remote_lease_seconds": 1e308}, n)
    assert count == 0 and "remote_lease_seconds" in reason and "3600" in reason
    count, reason = decode_verdict(decode, "far-1.2", {**good, "pdfleet_params_version": "1.2",
                                                      "remote_lease_expiry": 1e308}, n)
    assert count == 0 and "remote_lease_expiry" in reason and "ahead" in reason
    huge = {**good, "remote_block_ids": [list(range(1_000_000))]}
    t0 = time.perf_counter()
    count, reason = decode_verdict(decode, "huge", huge, n)
    took = time.perf_counter() - t0
    print(f"row 11: 10^6 block ids refused in {took * 1e3:.2f} ms: {reason}")
    assert count == 0 and "remote_block_ids" in reason and took < 0.02
    # Signed params this decode cannot use (prefill TP 2 does not divide decode TP 1... here the prompt
    # changed between the legs): refused with the reason, and the prefill is told to free the blocks.
    count, reason = decode_verdict(decode, "changed-prompt", dict(good), 10 * BLOCK)
    assert count == 0 and reason is not None
    releases = decode.build_connector_meta(None).releases
    assert any(r.remote_request_ids == ("r1",) and r.host == "10.0.0.7" and r.port == 5600 for r in releases), releases
    # ...but never for params nobody signed: those name a host a client chose.
    decode_verdict(decode, "unsigned", {k: v for k, v in good.items() if k != "pdfleet_signature"}
                   | {"remote_host": "169.254.169.254"}, n)
    assert decode.build_connector_meta(None).releases == ()
