"""Issue 19, leases that cannot lie: kv_transfer_params 1.3 carry the lease as a duration.

A decode (real SchedulerSide, real KVSink) and a router whose wall clock is an hour off the prefill's
(``time.time`` replaced in this process, as ``PDFLEET_TEST_WALL_CLOCK_STEP`` does in an engine) still
admit, pull and reuse 1.3 params, against a real KVSource in its own process (NIXL/UCX on DRAM, ZMQ).
Negative control: the same lease in the 1.2 form (a unix instant, signed v1) is refused by the same
decode and not reused by the same router. The side channel runs without a key here: its own replay
window (30 s of wall clock) is another guard, tested in test_hostile_peers.py."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from transfer_harness import wait_for

from pdfleet.connector.adapter.config import parse_adapter_config
from pdfleet.connector.adapter.signed_params import sign_params
from pdfleet.connector.adapter.scheduler import SchedulerSide
from pdfleet.connector.serving.endpoints import lease_allows_reuse
from pdfleet.contract import kv_params as K

BLOCK = 16
LEASE = 30.0
KEY = b"k" * 32
REAL_TIME = time.time


def side(key_file: str, src, *, producer: bool) -> SchedulerSide:
    cfg = parse_adapter_config({"auth_secret_file": key_file, "lease_seconds": LEASE},
                               env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "127.0.0.1",
                                    "VLLM_NIXL_SIDE_CHANNEL_PORT": str(src.base_port)})
    s = SchedulerSide(cfg=cfg, engine_id="prefill-0" if producer else "decode-0", block_size=BLOCK, tp_size=1,
                      is_producer=producer, is_consumer=not producer)
    s.instance_ids = {0: src.instance_id}
    return s


def prefill_params(prefill: SchedulerSide, rid: str, blocks: list[int]) -> dict:
    from vllm.v1.request import RequestStatus

    req = SimpleNamespace(request_id=rid, kv_transfer_params={"do_remote_decode": True},
                          status=RequestStatus.FINISHED_LENGTH_CAPPED, num_computed_tokens=len(blocks) * BLOCK)
    delay, params = prefill.request_finished(req, blocks)
    assert delay and params is not None
    return params


def as_1_2(params: dict, expiry: float) -> dict:
    """The same lease as a 1.2 prefill wrote it: the unix instant on the prefill's clock, signed v1."""
    out = {k: v for k, v in params.items() if k not in (K.REMOTE_LEASE_SECONDS, K.SIG_KEY)}
    out |= {K.VERSION_KEY: "1.2", K.REMOTE_LEASE_EXPIRY: expiry}
    out[K.SIG_KEY] = sign_params(out, KEY, "v1")
    return out


def decode_admits(decode: SchedulerSide, rid: str, params: dict, local: list[int]):
    """What decode's scheduler decides for a request with ``params``: (PullSpec or None, refusal or None)."""
    req = SimpleNamespace(request_id=rid, kv_transfer_params=params, num_prompt_tokens=len(local) * BLOCK + 1,
                          status=None, num_computed_tokens=0)
    decode.on_new_request(req)
    count, _ = decode.get_num_new_matched_tokens(req, 0)
    if count == 0:
        return None, decode._rejected.get(rid)
    blocks = SimpleNamespace(blocks=[[SimpleNamespace(block_id=b) for b in local]])
    decode.update_state_after_alloc(req, blocks, count)
    return decode.build_connector_meta(None).pulls[rid], None


@pytest.fixture
def key_file(tmp_path):
    path = tmp_path / "fleet-key"
    path.write_bytes(KEY)
    return str(path)


@pytest.mark.parametrize("step", [3600.0, -3600.0], ids=["decode+router an hour ahead", "an hour behind"])
def test_a_stepped_wall_clock_still_admits_pulls_and_reuses_1_3_leases(step, key_file, source_factory,
                                                                         sink_factory, local_kv, monkeypatch):
    src = source_factory(lease=LEASE)
    prefill = side(key_file, src, producer=True)
    params = prefill_params(prefill, "r13", [3, 4])
    old = as_1_2(params, REAL_TIME() + LEASE)  # what a 1.2 prefill would have said at the same moment
    src.hold("r13", [3, 4], lease_id=K.lease_id_of(params))  # as the prefill's worker holds it (1.4: with its id)
    assert K.version_of(params) >= K.LEASE_SECONDS_SINCE and K.REMOTE_LEASE_EXPIRY not in params

    monkeypatch.setattr(time, "time", lambda: REAL_TIME() + step)  # decode's and the router's wall clock
    received_at, wall_at_receipt = time.monotonic(), time.time()  # the router gets prefill's answer

    decode = side(key_file, src, producer=False)
    spec, refused = decode_admits(decode, "d13", params, [5, 6])
    assert refused is None and spec is not None
    remote = spec.remote
    assert remote.remote_lease_seconds == LEASE
    assert 0 < remote.lease_deadline - time.monotonic() <= LEASE  # an upper bound on this host's monotonic clock

    sink = sink_factory(local_kv)
    t0 = time.monotonic()
    sink.pull(remote.remote_request_id, host=remote.remote_host, port=remote.remote_port,
              remote_engine_id=remote.remote_engine_id, remote_instance_id=remote.remote_instance_id,
              remote_block_ids=list(spec.remote_block_ids), local_block_ids=list(spec.local_block_ids),
              remote_tp_size=remote.tp_size, remote_lease_expiry=remote.remote_lease_expiry,
              remote_lease_deadline=remote.lease_deadline, lease_id=remote.remote_lease_id)  # as the worker does
    ok, reason = wait_for(sink, "r13")
    print(f"wall clock {step:+.0f}s: 1.3 params admitted, pulled ok={ok} in {time.monotonic() - t0:.3f}s {reason}")
    assert ok, reason
    for region in range(2):
        for remote_block, local_block in ((3, 5), (4, 6)):
            assert (local_kv.block(region, local_block) == src.expected(region, remote_block)).all()
    assert lease_allows_reuse(params, time.monotonic(), 1.0, received_at=received_at,
                              wall_at_receipt=wall_at_receipt)

    # Negative control: the same lease as a wall-clock instant (1.2) is refused by the same decode
    # (expired an hour ago, or an hour ahead) and not reused by the same router.
    spec, refused = decode_admits(decode, "d12", old, [7, 8])
    print(f"wall clock {step:+.0f}s: the 1.2 form is refused: {refused}")
    assert spec is None and refused is not None and K.REMOTE_LEASE_EXPIRY in refused
    assert ("expired" if step > 0 else "ahead") in refused
    assert not lease_allows_reuse(old, time.monotonic(), 1.0, received_at=received_at,
                                  wall_at_receipt=wall_at_receipt)


def test_the_1_2_form_is_still_admitted_when_the_clocks_agree(key_file, source_factory, sink_factory, local_kv):
    """Rolling upgrade: a 1.2 prefill's params (v1, an instant) are admitted and pulled by a 1.3 decode."""
    src = source_factory(lease=LEASE)
    prefill = side(key_file, src, producer=True)
    old = as_1_2(prefill_params(prefill, "r12", [1]), src.hold("r12", [1]))
    decode = side(key_file, src, producer=False)
    spec, refused = decode_admits(decode, "d12", old, [9])
    assert refused is None and spec.remote.remote_lease_expiry == old[K.REMOTE_LEASE_EXPIRY]
    assert spec.remote.lease_deadline is None
    sink = sink_factory(local_kv)
    remote = spec.remote
    sink.pull(remote.remote_request_id, host=remote.remote_host, port=remote.remote_port,
              remote_engine_id=remote.remote_engine_id, remote_instance_id=remote.remote_instance_id,
              remote_block_ids=list(spec.remote_block_ids), local_block_ids=list(spec.local_block_ids),
              remote_tp_size=remote.tp_size, remote_lease_expiry=remote.remote_lease_expiry,
              remote_lease_deadline=remote.lease_deadline)
    assert wait_for(sink, "r12") == (True, "")
    received_at = time.monotonic()
    assert lease_allows_reuse(old, received_at, 1.0, received_at=received_at, wall_at_receipt=time.time())
