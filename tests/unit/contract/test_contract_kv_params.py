"""kv_transfer_params: the connector's producer and the router's and decode's readers agree.

Every params object here comes from the connector's own producer (``producer_params``, which
the scheduler calls when a prefill finishes); nothing is a hand-written dict of keys, so a key
renamed on one side only fails these tests.
"""

from __future__ import annotations

import pytest

from pdfleet.connector.adapter.params import InvalidTransferParams, parse_remote_prefill, producer_params
from pdfleet.connector.router.endpoints import lease_allows_reuse
from pdfleet.contract import kv_params

NOW = 1_000_000.0


def produced(lease_expiry: float = NOW + 120, **overrides) -> dict:
    kwargs = dict(block_ids=[3, 4, 5], engine_id="prefill-0", request_id="cmpl-1", host="10.0.0.7", port=5600,
                  tp_size=1, instance_id="inst-a", lease_expiry=lease_expiry, num_tokens=40)
    return producer_params(**(kwargs | overrides))


def decode_reads(params: dict):
    return parse_remote_prefill(params, num_prompt_tokens=40, block_size=16, local_tp_size=1, now=NOW)


def test_the_router_reads_the_lease_the_connector_writes():
    """The bug this schema fixed: the connector wrote one key, the router read another, so a decode
    retry never reused prefill's KV."""
    assert lease_allows_reuse(produced(NOW + 120), now=NOW, margin_s=1.0)
    assert not lease_allows_reuse(produced(NOW + 0.5), now=NOW, margin_s=1.0)  # too little lease left
    assert not lease_allows_reuse(produced(NOW - 1), now=NOW, margin_s=1.0)
    # negative control: the same params without the lease key are never reused
    stripped = {k: v for k, v in produced().items() if k != kv_params.REMOTE_LEASE_EXPIRY}
    assert not lease_allows_reuse(stripped, now=NOW, margin_s=1.0)


def test_decode_reads_what_prefill_writes():
    remote = decode_reads(produced())
    assert (remote.remote_engine_id, remote.remote_request_id, remote.remote_host, remote.remote_port) == (
        "prefill-0", "cmpl-1", "10.0.0.7", 5600)
    assert remote.remote_block_ids == (3, 4, 5) and remote.remote_lease_expiry == NOW + 120


def test_the_producer_writes_the_current_version():
    params = produced()
    assert params[kv_params.VERSION_KEY] == kv_params.version_string()
    assert kv_params.version_of(params) == kv_params.VERSION


@pytest.mark.parametrize("version, readable", [
    (None, True),  # engines before the version key: 1.0, same keys
    ("1.0", True),
    ("1.1", True),
    ("1.42", True),  # a newer minor version only adds optional keys
    ("2.0", False),  # a newer major version may mean other keys: refused
    ("0.9", False),
    ("1", False),
    (1.1, False),
    ("1.1; drop", False),
])
def test_readers_refuse_a_newer_major_version_with_a_reason(version, readable):
    params = produced()
    if version is None:
        del params[kv_params.VERSION_KEY]
    else:
        params[kv_params.VERSION_KEY] = version
    if readable:
        assert decode_reads(params).remote_block_ids == (3, 4, 5)
        assert lease_allows_reuse(params, now=NOW, margin_s=1.0)
        return
    with pytest.raises(InvalidTransferParams) as err:
        decode_reads(params)
    assert err.value.field == kv_params.VERSION_KEY
    with pytest.raises(kv_params.UnsupportedVersion, match=kv_params.VERSION_KEY):
        kv_params.lease_expiry(params)
    assert not lease_allows_reuse(params, now=NOW, margin_s=1.0)
    if version == "2.0":
        assert f"newer than this reader's {kv_params.version_string()}" in str(err.value)


def test_a_signature_field_is_ignored_by_version_1_readers():
    params = produced() | {kv_params.SIG_KEY: "reserved-for-a-later-minor-version"}
    assert decode_reads(params).remote_engine_id == "prefill-0"
    assert lease_allows_reuse(params, now=NOW, margin_s=1.0)
