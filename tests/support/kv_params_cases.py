"""Params cases the strict reader's tests and the signature's tests share: a 1.4 params set as a
prefill returns it (``good``) and the clocks a decode reads it at."""

from __future__ import annotations

from pdfleet.contract.kv_params import produce

NOW = 1_000_000.0
BS = 32


def good(**over):
    p = produce(
        block_ids=[4, 5, 6],
        engine_id="prefill-0",
        request_id="cmpl-1",
        host="10.0.0.7",
        port=5600,
        tp_size=1,
        instance_id="abc",
        lease_seconds=30,
        num_tokens=80,
    )
    p.update(over)
    return p


MONO = 5_000.0  # the decode scheduler's monotonic clock when it accepted the params
OLD = {"pdfleet_params_version": "1.2"}  # params of a not yet upgraded prefill: a wall-clock expiry
