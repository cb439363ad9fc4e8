"""kv_transfer_params: the connector's producer and the router's and decode's readers agree.

Every params object here comes from the connector's own producer (``produce``, which
the scheduler calls when a prefill finishes); nothing is a hand-written dict of keys, so a key
renamed on one side only fails these tests.
"""

from __future__ import annotations

import pytest

from pdfleet.connector.serving.endpoints import lease_allows_reuse
from pdfleet.contract import kv_params
from pdfleet.contract.kv_params import InvalidTransferParams, parse_remote_prefill, produce

NOW = 1_000_000.0  # wall clock
MONO = 5_000.0  # monotonic clock of the reader (router, decode) when the params arrived


def produced(lease_seconds: float = 120.0, **overrides) -> dict:
    kwargs = dict(block_ids=[3, 4, 5], engine_id="prefill-0", request_id="cmpl-1", host="10.0.0.7", port=5600,
                  tp_size=1, instance_id="inst-a", lease_seconds=lease_seconds, num_tokens=40)
    return produce(**(kwargs | overrides))


def as_1_2(params: dict, expiry: float) -> dict:
    """The same params as a 1.2 prefill wrote them: a unix expiry instead of a duration."""
    out = {k: v for k, v in params.items() if k != kv_params.REMOTE_LEASE_SECONDS}
    return out | {kv_params.VERSION_KEY: "1.2", kv_params.REMOTE_LEASE_EXPIRY: expiry}


def decode_reads(params: dict, now: float = NOW):
    return parse_remote_prefill(params, num_prompt_tokens=40, block_size=16, local_tp_size=1, now=now,
                                accepted_at=MONO)


def reuse(params, now=MONO, wall=NOW) -> bool:
    return lease_allows_reuse(params, now=now, margin_s=1.0, received_at=MONO, wall_at_receipt=wall)


def test_the_router_reads_the_lease_the_connector_writes():
    """The bug this schema fixed: the connector wrote one key, the router read another, so a decode
    retry never reused prefill's KV."""
    assert reuse(produced(120))
    assert reuse(produced(120), now=MONO + 118.5)
    assert not reuse(produced(120), now=MONO + 119.5)  # too little lease left
    assert not reuse(produced(0.5))
    # negative control: the same params without the lease key are never reused
    stripped = {k: v for k, v in produced().items() if k != kv_params.REMOTE_LEASE_SECONDS}
    assert not reuse(stripped)


def test_the_producer_writes_a_duration_and_no_wall_clock_instant():
    params = produced(30)
    assert params[kv_params.REMOTE_LEASE_SECONDS] == 30.0 and kv_params.REMOTE_LEASE_EXPIRY not in params
    assert kv_params.lease_seconds(params) == 30.0


def test_decode_reads_what_prefill_writes():
    remote = decode_reads(produced())
    assert (remote.remote_engine_id, remote.remote_request_id, remote.remote_host, remote.remote_port) == (
        "prefill-0", "cmpl-1", "10.0.0.7", 5600)
    assert remote.remote_block_ids == (3, 4, 5)
    assert remote.remote_lease_seconds == 120.0 and remote.lease_deadline == MONO + 120
    assert remote.remote_lease_expiry is None


def test_a_1_2_prefill_is_still_read_the_1_2_way():
    old = as_1_2(produced(), NOW + 120)
    remote = decode_reads(old)
    assert remote.remote_lease_expiry == NOW + 120 and remote.lease_deadline is None
    assert remote.remote_lease_seconds is None
    assert reuse(old) and not reuse(old, now=MONO + 119.5)
    # a duration added to 1.2 params is not read (a 1.2 prefill never wrote one)
    assert decode_reads(old | {kv_params.REMOTE_LEASE_SECONDS: 999}).remote_lease_seconds is None


@pytest.mark.parametrize("params, deadline", [
    pytest.param(produced(30), MONO + 30, id="1.3: received + seconds"),
    pytest.param(produced(kv_params.MAX_LEASE_SECONDS), MONO + kv_params.MAX_LEASE_SECONDS, id="1.3: the most"),
    pytest.param(produced() | {kv_params.REMOTE_LEASE_SECONDS: 30}, MONO + 30, id="1.3: an integer"),
    pytest.param(produced() | {kv_params.REMOTE_LEASE_SECONDS: None}, None, id="1.3: missing"),
    pytest.param(produced() | {kv_params.REMOTE_LEASE_SECONDS: -5.0}, None, id="1.3: negative"),
    pytest.param(produced() | {kv_params.REMOTE_LEASE_SECONDS: 0.0}, None, id="1.3: zero"),
    pytest.param(produced() | {kv_params.REMOTE_LEASE_SECONDS: float("nan")}, None, id="1.3: NaN"),
    pytest.param(produced() | {kv_params.REMOTE_LEASE_SECONDS: float("inf")}, None, id="1.3: inf"),
    pytest.param(produced() | {kv_params.REMOTE_LEASE_SECONDS: True}, None, id="1.3: bool"),
    pytest.param(produced() | {kv_params.REMOTE_LEASE_SECONDS: "30"}, None, id="1.3: a string"),
    pytest.param(produced() | {kv_params.REMOTE_LEASE_SECONDS: 3600.5}, None, id="1.3: more than the most"),
    # a 1.3 reader takes no wall-clock instant from 1.3 params, even if one is added
    pytest.param(produced() | {kv_params.REMOTE_LEASE_SECONDS: None, kv_params.REMOTE_LEASE_EXPIRY: NOW + 30},
                 None, id="1.3: an instant is not read"),
    pytest.param(as_1_2(produced(), NOW + 30), MONO + 30, id="1.2: converted at receipt"),
    pytest.param(as_1_2(produced(), NOW - 30), MONO - 30, id="1.2: already expired"),
    pytest.param(as_1_2(produced(), 1e308), None, id="1.2: absurdly far"),
    pytest.param(as_1_2(produced(), float("nan")), None, id="1.2: NaN"),
    pytest.param(as_1_2(produced(), True), None, id="1.2: bool"),
    pytest.param({k: v for k, v in as_1_2(produced(), 1.0).items() if k != kv_params.REMOTE_LEASE_EXPIRY},
                 None, id="1.2: missing"),
    pytest.param({}, None, id="no params"),
])
def test_lease_deadline(params, deadline):
    assert kv_params.lease_deadline(params, MONO, NOW) == deadline


def test_a_1_2_lease_needs_the_wall_clock_at_receipt():
    assert kv_params.lease_deadline(as_1_2(produced(), NOW + 30), MONO) is None
    assert kv_params.lease_deadline(produced(30), MONO) == MONO + 30  # 1.3 needs none


def test_the_producer_writes_the_current_version():
    params = produced()
    assert params[kv_params.VERSION_KEY] == kv_params.version_string()
    assert kv_params.version_of(params) == kv_params.VERSION


@pytest.mark.parametrize("version, readable", [
    (None, True),  # engines before the version key: 1.0, same keys
    ("1.0", True),
    ("1.1", True),
    ("1.2", True),
    ("1.3", True),
    ("1.42", True),  # a newer minor version only adds optional keys
    ("2.0", False),  # a newer major version may mean other keys: refused
    ("0.9", False),
    ("1", False),
    (1.1, False),
    ("1.1; drop", False),
])
def test_readers_refuse_a_newer_major_version_with_a_reason(version, readable):
    params = produced()
    if version in (None, "1.0", "1.1", "1.2"):  # those versions carry the lease as an instant
        params = as_1_2(params, NOW + 120)
    if version is None:
        del params[kv_params.VERSION_KEY]
    else:
        params[kv_params.VERSION_KEY] = version
    if readable:
        assert decode_reads(params).remote_block_ids == (3, 4, 5)
        assert reuse(params)
        return
    with pytest.raises(InvalidTransferParams) as err:
        decode_reads(params)
    assert err.value.field == kv_params.VERSION_KEY
    with pytest.raises(kv_params.UnsupportedVersion, match=kv_params.VERSION_KEY):
        kv_params.lease_deadline(params, MONO, NOW)
    assert not reuse(params)
    if version == "2.0":
        assert f"newer than this reader's {kv_params.version_string()}" in str(err.value)


def test_a_signature_field_is_ignored_by_version_1_readers():
    params = produced() | {kv_params.SIG_KEY: "reserved-for-a-later-minor-version"}
    assert decode_reads(params).remote_engine_id == "prefill-0"
    assert reuse(params)


# -- issue 30: an unusable lease is no lease, never an exception; params 1.4 carry a lease id ----------
@pytest.mark.parametrize("seconds", [
    10**400,  # a JSON integer too large for a float: OverflowError before issue 30
    -(10**400), float("inf"), float("-inf"), float("nan"), -1.0, 0, kv_params.MAX_LEASE_SECONDS + 0.001, "30", None,
    True,
])  # fmt: skip
def test_an_unusable_lease_gives_no_deadline_and_no_reuse(seconds):
    params = produced() | {kv_params.REMOTE_LEASE_SECONDS: seconds}
    assert kv_params.lease_seconds(params) is None
    assert kv_params.lease_deadline(params, MONO, NOW) is None
    assert not reuse(params)  # the router's decode retry then recomputes and releases, as for any refusal
    if seconds is None:
        return  # optional for decode: then only the source's acks bound the pull
    with pytest.raises(InvalidTransferParams) as err:  # and decode refuses the params: computed locally
        decode_reads(params)
    assert err.value.field == kv_params.REMOTE_LEASE_SECONDS


def test_an_unusable_1_2_expiry_gives_no_deadline():
    for expiry in (10**400, -(10**400), float("inf"), float("nan")):
        assert kv_params.lease_deadline(as_1_2(produced(), expiry), MONO, NOW) is None
        assert not reuse(as_1_2(produced(), expiry))


def test_the_lease_id_round_trips_and_a_malformed_one_is_none():
    lease_id = kv_params.new_lease_id()
    params = produced(lease_id=lease_id)
    assert kv_params.is_lease_id(lease_id) and kv_params.lease_id_of(params) == lease_id
    assert params[kv_params.REMOTE_LEASE_ID] == lease_id.hex()
    for bad in ("", lease_id.hex().upper(), lease_id.hex()[:-2], 7, None):
        assert kv_params.lease_id_of(params | {kv_params.REMOTE_LEASE_ID: bad}) is None
    with pytest.raises(ValueError, match="lease_id"):
        produced(lease_id=b"short")
    assert kv_params.LEASE_ID_SINCE == kv_params.VERSION == (1, 4)
    assert kv_params.REMOTE_LEASE_ID in kv_params.SIGNED_FIELDS
