"""kv_transfer_params validation and connector config (pure, no vLLM engine)."""

from __future__ import annotations

import pytest

from pdfleet.connector.adapter.config import ConfigError, parse_adapter_config
from pdfleet.connector.adapter.nodes import host_for_rank
from pdfleet.connector.adapter.params import (
    InvalidTransferParams,
    num_tokens_to_pull,
    parse_remote_prefill,
    producer_params,
)

NOW = 1_000_000.0
BS = 32


def good(**over):
    p = producer_params(
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


def parse(params, n=80, tp=1):
    return parse_remote_prefill(params, num_prompt_tokens=n, block_size=BS, local_tp_size=tp, now=NOW,
                                accepted_at=MONO)


def test_round_trip_of_producer_params():
    r = parse(good())
    assert r.remote_block_ids == (4, 5, 6)
    assert (r.remote_host, r.remote_port, r.remote_engine_id, r.remote_request_id) == ("10.0.0.7", 5600, "prefill-0", "cmpl-1")
    assert r.remote_instance_id == "abc" and r.remote_lease_seconds == 30.0 and r.lease_deadline == MONO + 30
    assert r.remote_lease_expiry is None


def test_1_2_params_keep_their_wall_clock_expiry():
    r = parse({**good(), **OLD, "remote_lease_expiry": NOW + 30})
    assert r.remote_lease_expiry == NOW + 30 and r.lease_deadline is None and r.remote_lease_seconds is None


def test_a_1_3_lease_needs_no_time_of_acceptance_to_be_valid():
    r = parse_remote_prefill(good(), num_prompt_tokens=80, block_size=BS, local_tp_size=1, now=NOW)
    assert r.remote_lease_seconds == 30.0 and r.lease_deadline is None


def test_remote_hosts_round_trip_and_name_each_ranks_host():
    p = producer_params(block_ids=[4, 5, 6], engine_id="prefill-0", request_id="cmpl-1", host="10.0.0.7", port=5600,
                        tp_size=4, instance_id=None, lease_seconds=30, num_tokens=80,
                        hosts=("10.0.0.7", "pf-0-1.pf.ns"))
    r = parse(p, tp=4)
    assert r.hosts == ("10.0.0.7", "pf-0-1.pf.ns")
    assert [host_for_rank(r.hosts, rank, r.tp_size) for rank in range(4)] == ["10.0.0.7"] * 2 + ["pf-0-1.pf.ns"] * 2
    one = parse(good())  # a single-node prefill: no remote_hosts, every rank at remote_host
    assert "remote_hosts" not in good() and one.hosts == ("10.0.0.7",)


def test_flat_block_list_is_accepted():
    assert parse(good(remote_block_ids=[1, 2])).remote_block_ids == (1, 2)


@pytest.mark.parametrize(
    "override, field",
    [
        ({"do_remote_prefill": "yes"}, "do_remote_prefill"),
        ({"do_remote_decode": True}, "do_remote_decode"),
        ({"remote_block_ids": None}, "remote_block_ids"),
        ({"remote_block_ids": "1,2"}, "remote_block_ids"),
        ({"remote_block_ids": [[1, 2], [3]]}, "remote_block_ids"),
        ({"remote_block_ids": [[1]]}, "remote_block_ids"),  # too short: 80 tokens need 2 full blocks
        ({"remote_block_ids": [list(range(10))]}, "remote_block_ids"),  # too long
        ({"remote_block_ids": [[1, -2, 3]]}, "remote_block_ids[1]"),
        ({"remote_block_ids": [[1, 2**40, 3]]}, "remote_block_ids[1]"),
        ({"remote_block_ids": [[1, "2", 3]]}, "remote_block_ids[1]"),
        ({"remote_block_ids": [[1, True, 3]]}, "remote_block_ids[1]"),
        ({"remote_block_ids": [[1, 1, 3]]}, "remote_block_ids"),
        ({"remote_engine_id": ""}, "remote_engine_id"),
        ({"remote_engine_id": 7}, "remote_engine_id"),
        ({"remote_request_id": None}, "remote_request_id"),
        ({"remote_host": "0.0.0.0"}, "remote_host"),
        ({"remote_host": "bad host!"}, "remote_host"),
        ({"remote_host": ["10.0.0.1"]}, "remote_host"),
        ({"remote_port": 0}, "remote_port"),
        ({"remote_port": 70000}, "remote_port"),
        ({"remote_port": "5600"}, "remote_port"),
        ({"tp_size": 3}, "tp_size"),  # does not divide decode TP 2 (see below)
        ({"tp_size": 0}, "tp_size"),
        ({"remote_instance_id": "a,b"}, "remote_instance_id"),
        ({**OLD, "remote_lease_expiry": NOW - 1}, "remote_lease_expiry"),
        ({**OLD, "remote_lease_expiry": "soon"}, "remote_lease_expiry"),
        ({**OLD, "remote_lease_expiry": NOW + 3601}, "remote_lease_expiry"),
        ({"remote_lease_seconds": -1.0}, "remote_lease_seconds"),
        ({"remote_lease_seconds": 0}, "remote_lease_seconds"),
        ({"remote_lease_seconds": float("nan")}, "remote_lease_seconds"),
        ({"remote_lease_seconds": float("inf")}, "remote_lease_seconds"),
        ({"remote_lease_seconds": True}, "remote_lease_seconds"),
        ({"remote_lease_seconds": "30"}, "remote_lease_seconds"),
        ({"remote_lease_seconds": 3600.5}, "remote_lease_seconds"),
        ({"remote_lease_seconds": 1e308}, "remote_lease_seconds"),
        ({"remote_num_tokens": 10}, "remote_num_tokens"),
        ({"remote_hosts": "10.0.0.7"}, "remote_hosts"),
        ({"remote_hosts": []}, "remote_hosts"),
        ({"remote_hosts": ["a", "b", "c"]}, "remote_hosts"),  # 3 nodes cannot hold tp_size 2 evenly
        ({"remote_hosts": ["10.0.0.7", "0.0.0.0"]}, "remote_hosts[1]"),
        ({"remote_hosts": ["10.0.0.7", 7]}, "remote_hosts[1]"),
        ({"remote_hosts": ["bad host!"]}, "remote_hosts[0]"),
    ],
)
def test_bad_params_name_the_field(override, field):
    with pytest.raises(InvalidTransferParams) as exc:
        parse(good(**override, **({"tp_size": 2} if "remote_hosts" in override else {})), tp=2)
    assert exc.value.field == field
    assert str(exc.value).startswith(f"kv_transfer_params.{field}:")


@pytest.mark.parametrize("override", [
    {"remote_lease_expiry": NOW - 1},  # 1.3: an instant is not read, so a stale one refuses nothing
    {"remote_lease_expiry": "soon"},
    {"remote_lease_seconds": None},  # optional: then only the acks bound the pull
], ids=["1.3 ignores an expiry", "1.3 ignores a bad expiry", "1.3 without seconds"])
def test_1_3_params_read_no_wall_clock(override):
    assert parse(good(**override)).remote_lease_expiry is None


def test_the_refusals_of_a_lease_say_what_is_allowed():
    with pytest.raises(InvalidTransferParams, match=r"remote_lease_seconds: must be a number of seconds in \(0, 3600\]"):
        parse(good(remote_lease_seconds=-1))


def test_missing_keys_are_named():
    for key in ("remote_engine_id", "remote_request_id", "remote_host", "remote_port", "remote_block_ids"):
        p = good()
        del p[key]
        with pytest.raises(InvalidTransferParams) as exc:
            parse(p)
        assert exc.value.field == key


def test_root_must_be_an_object():
    with pytest.raises(InvalidTransferParams):
        parse(["do_remote_prefill"])


def test_heterogeneous_tp_accepts_multiples():
    assert parse(good(tp_size=1), tp=2).tp_size == 1
    assert parse(good(tp_size=2, remote_instance_id="a,b"), tp=4).tp_size == 2


@pytest.mark.parametrize("n, pulled", [(0, 0), (1, 0), (31, 0), (32, 32), (33, 32), (64, 64), (95, 64)])
def test_full_blocks_only(n, pulled):
    assert num_tokens_to_pull(n, BS) == pulled


def test_short_prompt_needs_no_blocks():
    assert parse(good(remote_block_ids=[[3]]), n=20).remote_block_ids == (3,)


def test_config_defaults_and_loopback_fallback(tmp_path):
    cfg = parse_adapter_config({"allow_unauthenticated": True}, env={})
    assert cfg.side_channel_host == "127.0.0.1" and cfg.side_channel_port == 5600
    assert cfg.secret is None and cfg.backends == ("UCX",)
    secret = tmp_path / "s"
    secret.write_bytes(b"0123456789abcdef-secret\n")
    cfg = parse_adapter_config(
        {"lease_seconds": 5, "auth_secret_file": str(secret), "handshake_timeout": 1.5},
        env={"VLLM_NIXL_SIDE_CHANNEL_HOST": "10.1.2.3", "VLLM_NIXL_SIDE_CHANNEL_PORT": "7000"},
    )
    assert (cfg.side_channel_host, cfg.side_channel_port, cfg.lease_seconds) == ("10.1.2.3", 7000, 5.0)
    assert cfg.secret == b"0123456789abcdef-secret" and cfg.handshake_timeout == 1.5


OPEN = {"allow_unauthenticated": True}


@pytest.mark.parametrize(
    "extra, env, needle",
    [
        (OPEN, {"VLLM_NIXL_SIDE_CHANNEL_HOST": "0.0.0.0"}, "wildcard"),
        (OPEN, {"VLLM_NIXL_SIDE_CHANNEL_PORT": "x"}, "VLLM_NIXL_SIDE_CHANNEL_PORT"),
        ({"lease_seconds": 0, **OPEN}, {}, "lease_seconds"),
        ({"backends": [], **OPEN}, {}, "backends"),
        # secure by default: no key file and no explicit opt-out
        ({}, {}, "auth_secret_file is not set"),
        ({"allow_unauthenticated": "yes"}, {}, "allow_unauthenticated must be true or false"),
        ({"auth_secret_file": "/nonexistent/secret"}, {}, "auth_secret_file"),
        ({"secret": "inline"}, {}, "unknown keys"),
        ({"handshake_retries": -1}, {}, "handshake_retries"),
        ({"read_floor_bandwidth": 0, **OPEN}, {}, "read_floor_bandwidth must be a number > 0"),
        ({"read_timeout_floor": "5", **OPEN}, {}, "read_timeout_floor must be a number > 0"),
    ],
)
def test_config_errors(extra, env, needle):
    with pytest.raises(ConfigError, match=needle):
        parse_adapter_config(extra, env=env)


def test_short_secret_is_refused(tmp_path):
    f = tmp_path / "s"
    f.write_bytes(b"short")
    with pytest.raises(ConfigError, match="16"):
        parse_adapter_config({"auth_secret_file": str(f)}, env={})


# -- signed params (issue 19) ------------------------------------------------------------------------
def _signed(key: bytes = b"k" * 32) -> dict:
    from pdfleet.connector.adapter.params import SIGNATURE_KEY, sign_params

    p = producer_params(block_ids=[4, 5, 6], engine_id="prefill-0", request_id="cmpl-1", host="10.0.0.7", port=5600,
                        tp_size=1, instance_id="i0", lease_seconds=30, num_tokens=40, hosts=())
    p[SIGNATURE_KEY] = sign_params(p, key)
    return p


def _signed_1_2(key: bytes = b"k" * 32) -> dict:
    """What a not yet upgraded (1.2) prefill returns: a unix expiry, signed v1."""
    from pdfleet.connector.adapter.params import SIGNATURE_KEY, sign_params

    p = producer_params(block_ids=[4, 5, 6], engine_id="prefill-0", request_id="cmpl-1", host="10.0.0.7", port=5600,
                        tp_size=1, instance_id="i0", lease_seconds=30, num_tokens=40, hosts=())
    del p["remote_lease_seconds"]
    p |= {"pdfleet_params_version": "1.2", "remote_lease_expiry": NOW + 30}
    p[SIGNATURE_KEY] = sign_params(p, key, "v1")
    return p


def test_signed_params_verify_after_a_json_round_trip():
    import json

    from pdfleet.connector.adapter.params import verify_params
    from pdfleet.connector.transfer.auth import KeyRing

    p = json.loads(json.dumps(_signed()))
    verify_params(p, KeyRing(b"k" * 32))
    p["remote_lease_seconds"] = int(p["remote_lease_seconds"])  # 30.0 written as 30 by some encoder
    verify_params(p, KeyRing(b"k" * 32))
    old = json.loads(json.dumps(_signed_1_2()))
    old["remote_lease_expiry"] = int(old["remote_lease_expiry"])
    verify_params(old, KeyRing(b"k" * 32))


@pytest.mark.parametrize("field,value", [
    ("remote_engine_id", "prefill-1"), ("remote_request_id", "cmpl-2"), ("remote_host", "10.0.0.8"),
    ("remote_hosts", ["10.0.0.7"]), ("remote_port", 5601), ("tp_size", 2), ("remote_block_ids", [[4, 5, 7]]),
    ("remote_instance_id", "i1"), ("remote_lease_seconds", 31.0), ("remote_num_tokens", 41),
    ("remote_lease_expiry", NOW + 31),  # v2 signs it absent: none can be added
    ("pdfleet_params_version", "1.2"),  # nor can 1.3 params pass for 1.2 (read the wall-clock way)
    ("pdfleet_params_version", "1.3"),  # nor 1.4 params for 1.3 (read without their lease id)
    ("remote_lease_id", "00" * 16),  # v3: a replayer cannot swap in another lease's id
])  # fmt: skip
def test_every_signed_field_is_bound(field, value):
    from pdfleet.connector.adapter.params import SIGNED_FIELDS, verify_params
    from pdfleet.connector.transfer.auth import KeyRing

    assert field in SIGNED_FIELDS
    with pytest.raises(InvalidTransferParams, match="pdfleet_signature"):
        verify_params({**_signed(), field: value}, KeyRing(b"k" * 32))


@pytest.mark.parametrize("sig,problem", [
    (None, "is required"), ("", "must be"), ("v4.aa.bb", "must be"), ("v3.xx.yy", "hex"),
    ("v3." + "00" * 8 + "." + "00" * 32, "does not accept"), (5, "must be"),
    ("v1.xx.yy", "version 1.2 or older only"),
    ("v2." + "00" * 8 + "." + "00" * 32, "version 1.3 or older only"),  # v2 leaves the lease id unsigned
])  # fmt: skip
def test_bad_signatures_are_named(sig, problem):
    from pdfleet.connector.adapter.params import SIGNATURE_KEY, verify_params
    from pdfleet.connector.transfer.auth import KeyRing

    p = _signed()
    if sig is None:
        del p[SIGNATURE_KEY]
    else:
        p[SIGNATURE_KEY] = sig
    with pytest.raises(InvalidTransferParams, match=problem):
        verify_params(p, KeyRing(b"k" * 32))


def test_parse_checks_the_signature_with_a_ring_and_bounds_expiry_first():
    from pdfleet.connector.transfer.auth import KeyRing

    ring = KeyRing(b"k" * 32)
    ok = parse_remote_prefill(_signed(), num_prompt_tokens=40, block_size=BS, local_tp_size=1, now=NOW, ring=ring)
    assert ok.remote_block_ids == (4, 5, 6)
    with pytest.raises(InvalidTransferParams, match="remote_lease_seconds.*3600"):
        parse_remote_prefill({**_signed(), "remote_lease_seconds": 1e308}, num_prompt_tokens=40, block_size=BS,
                             local_tp_size=1, now=NOW, ring=ring)
    with pytest.raises(InvalidTransferParams, match="remote_lease_expiry.*ahead"):
        parse_remote_prefill({**_signed_1_2(), "remote_lease_expiry": 1e308}, num_prompt_tokens=40, block_size=BS,
                             local_tp_size=1, now=NOW, ring=ring)
    with pytest.raises(InvalidTransferParams, match="pdfleet_signature"):
        parse_remote_prefill(_signed(b"x" * 32), num_prompt_tokens=40, block_size=BS, local_tp_size=1, now=NOW,
                             ring=ring)


def test_a_1_3_decode_verifies_a_1_2_prefills_v1_signature():
    """Rolling upgrade: a 1.2 prefill (v1 over SIGNED_FIELDS_V1) is still pulled from by a 1.3 decode."""
    from pdfleet.connector.adapter.params import SIGNED_FIELDS, SIGNED_FIELDS_V1, verify_params
    from pdfleet.connector.transfer.auth import KeyRing

    ring = KeyRing(b"k" * 32)
    old = _signed_1_2()
    assert old["pdfleet_signature"].startswith("v1.") and _signed()["pdfleet_signature"].startswith("v3.")
    assert set(SIGNED_FIELDS) - set(SIGNED_FIELDS_V1) == {"remote_lease_seconds", "pdfleet_params_version",
                                                          "remote_lease_id"}
    r = parse_remote_prefill(old, num_prompt_tokens=40, block_size=BS, local_tp_size=1, now=NOW, ring=ring,
                             accepted_at=MONO)
    assert r.remote_lease_expiry == NOW + 30 and r.lease_deadline is None
    with pytest.raises(InvalidTransferParams, match="pdfleet_signature.*match"):
        verify_params({**old, "remote_lease_expiry": NOW + 31}, ring)  # v1 still binds its fields
    # A v1 signature does not cover the duration nor the version: 1.2 params passed off as 1.3 (which
    # would read an unsigned remote_lease_seconds) are refused...
    with pytest.raises(InvalidTransferParams, match="1.2 or older only"):
        verify_params({**old, "pdfleet_params_version": "1.3", "remote_lease_seconds": 3000.0}, ring)
    # ...and a duration added to 1.2 params is not read, so it gains nothing
    r = parse_remote_prefill({**old, "remote_lease_seconds": 3000.0}, num_prompt_tokens=40, block_size=BS,
                             local_tp_size=1, now=NOW, ring=ring, accepted_at=MONO)
    assert r.remote_lease_seconds is None and r.lease_deadline is None


def test_read_bounds_are_configurable():
    cfg = parse_adapter_config({"read_floor_bandwidth": 1e8, "read_timeout_floor": 2, **OPEN}, env={})
    assert (cfg.read_floor_bandwidth, cfg.read_timeout_floor) == (1e8, 2.0)
    assert (parse_adapter_config(OPEN, env={}).read_floor_bandwidth, parse_adapter_config(OPEN, env={}).read_timeout_floor) == (50e6, 5.0)


def test_release_target_only_for_params_a_fleet_key_signed():
    from pdfleet.connector.adapter.params import SIGNATURE_KEY, release_target, sign_params
    from pdfleet.connector.transfer.auth import KeyRing

    ring = KeyRing(b"k" * 32)
    good = _signed()
    assert release_target(good, ring) == ("10.0.0.7", 5600, 1, "cmpl-1", ())
    assert release_target(good, None) is None  # no key: never dial what a client named
    assert release_target({**good, "remote_host": "169.254.169.254"}, ring) is None  # altered
    assert release_target({k: v for k, v in good.items() if k != SIGNATURE_KEY}, ring) is None
    huge = {**good, "remote_block_ids": [list(range(100_000))]}
    huge[SIGNATURE_KEY] = sign_params(huge, b"k" * 32)
    assert release_target(huge, ring) is None  # too many ids to be worth an HMAC
    assert release_target(["not", "a", "mapping"], ring) is None


def _own_release(params, ring, engine_id="prefill-0"):
    from pdfleet.connector.adapter.params import own_lease_to_release

    try:
        return own_lease_to_release(params, engine_id=engine_id, ring=ring)
    except InvalidTransferParams as exc:
        return exc.field


def _resigned(params):
    from pdfleet.connector.adapter.params import SIGNATURE_KEY, sign_params

    out = {k: v for k, v in params.items() if k != SIGNATURE_KEY}
    out[SIGNATURE_KEY] = sign_params(out, b"k" * 32)
    return out


@pytest.mark.parametrize("make, keyed, expected", [
    (lambda: _signed(), True, "cmpl-1"),  # its own params, as it signed them
    (lambda: good(), False, "cmpl-1"),  # a fleet without a key: the engine id and request id must match
    (lambda: {**_signed(), "remote_request_id": "cmpl-2"}, True, "pdfleet_signature"),  # another request's lease
    (lambda: {k: v for k, v in _signed().items() if k != "pdfleet_signature"}, True, "pdfleet_signature"),
    (lambda: _resigned({**good(), "remote_engine_id": "prefill-1"}), True, "remote_engine_id"),  # another prefill's
    (lambda: good(remote_engine_id="prefill-1"), False, "remote_engine_id"),
    (lambda: good(remote_request_id="x" * 300), False, "remote_request_id"),
    (lambda: {k: v for k, v in good().items() if k != "remote_request_id"}, False, "remote_request_id"),
    (lambda: good(pdfleet_params_version="9.0"), False, "pdfleet_params_version"),
    (lambda: _resigned({**good(), "remote_block_ids": [list(range(100_000))]}), True, "remote_block_ids"),
    (lambda: ["not", "a", "mapping"], True, "(root)"),
])
def test_a_prefill_releases_only_its_own_lease(make, keyed, expected):
    from pdfleet.connector.transfer.auth import KeyRing

    assert _own_release(make(), KeyRing(b"k" * 32) if keyed else None) == expected


# -- single-use leases (params 1.4, issue 30) ---------------------------------------------------------
def _signed_1_3(key: bytes = b"k" * 32) -> dict:
    """What a not yet upgraded (1.3) prefill returns: no lease id, signed v2."""
    from pdfleet.connector.adapter.params import SIGNATURE_KEY, sign_params

    p = producer_params(block_ids=[4, 5, 6], engine_id="prefill-0", request_id="cmpl-1", host="10.0.0.7", port=5600,
                        tp_size=1, instance_id="i0", lease_seconds=30, num_tokens=40)
    del p["remote_lease_id"]
    p["pdfleet_params_version"] = "1.3"
    p[SIGNATURE_KEY] = sign_params(p, key, "v2")
    return p


def test_1_4_params_carry_the_lease_id_decode_names():
    from pdfleet.contract import kv_params as K

    lease_id = bytes(range(16))
    p = producer_params(block_ids=[4, 5, 6], engine_id="prefill-0", request_id="cmpl-1", host="10.0.0.7", port=5600,
                        tp_size=1, instance_id="abc", lease_seconds=30, num_tokens=80, lease_id=lease_id)
    assert p["pdfleet_params_version"] == "1.4" and p["remote_lease_id"] == lease_id.hex()
    assert parse(p).remote_lease_id == lease_id
    # a fresh random one per call when none is given (what the scheduler does for each hold)
    assert K.lease_id_of(good()) != K.lease_id_of(good()) and len(K.lease_id_of(good())) == 16


@pytest.mark.parametrize("value", [None, "", "00" * 15, "00" * 17, "AB" * 16, "zz" * 16, 5, ["00" * 16], b"\0" * 16])
def test_a_1_4_lease_id_is_required_and_checked(value):
    p = good()
    if value is None:
        del p["remote_lease_id"]
    else:
        p["remote_lease_id"] = value
    with pytest.raises(InvalidTransferParams) as exc:
        parse(p)
    assert exc.value.field == "remote_lease_id" and "32 lowercase hex characters" in str(exc.value)
    # negative control: the same params with a good id pass
    assert parse({**p, "remote_lease_id": "ab" * 16}).remote_lease_id == bytes([0xAB]) * 16


def test_rolling_upgrade_a_1_4_decode_reads_a_1_3_prefills_params_the_1_3_way():
    from pdfleet.connector.adapter.params import verify_params
    from pdfleet.connector.transfer.auth import KeyRing

    ring = KeyRing(b"k" * 32)
    r = parse_remote_prefill(_signed_1_3(), num_prompt_tokens=40, block_size=BS, local_tp_size=1, now=NOW, ring=ring,
                             accepted_at=MONO)
    assert r.remote_lease_id is None and r.lease_deadline == MONO + 30  # no lease id: pulled as 1.3
    # v2 does not cover a lease id: one added to 1.3 params is not read (nothing gained) ...
    r = parse_remote_prefill({**_signed_1_3(), "remote_lease_id": "ab" * 16}, num_prompt_tokens=40, block_size=BS,
                             local_tp_size=1, now=NOW, ring=ring)
    assert r.remote_lease_id is None
    # ... and 1.3 params passed off as 1.4 under their v2 signature are refused
    with pytest.raises(InvalidTransferParams, match="v2 signature covers params of version 1.3 or older only"):
        verify_params({**_signed_1_3(), "pdfleet_params_version": "1.4", "remote_lease_id": "ab" * 16}, ring)


@pytest.mark.parametrize("field, value", [
    ("remote_lease_seconds", 10**400),  # a JSON integer too large for a float (was: OverflowError)
    ("remote_lease_seconds", -(10**400)),
    ("remote_lease_seconds", float("inf")),  # what JSON's 1e400 parses to
    ("remote_lease_seconds", float("nan")),
    ("remote_lease_seconds", -1.0),
    ("remote_lease_seconds", 3600.001),  # above the documented most (kv_params.MAX_LEASE_SECONDS)
    ("remote_lease_expiry", 10**400),
    ("remote_lease_expiry", float("-inf")),
])  # fmt: skip
def test_an_unusable_lease_is_refused_as_invalid_params_never_an_overflow(field, value):
    from pdfleet.connector.transfer.auth import KeyRing

    base = {**good(), **OLD} if field == "remote_lease_expiry" else good()
    for ring in (None, KeyRing(b"k" * 32)):
        with pytest.raises(InvalidTransferParams) as exc:
            parse_remote_prefill({**base, field: value}, num_prompt_tokens=80, block_size=BS, local_tp_size=1, now=NOW,
                                 ring=ring, accepted_at=MONO)
        assert exc.value.field == field and len(str(exc.value)) < 200  # a 400-digit number is not echoed


def test_signing_or_releasing_params_with_a_huge_number_is_a_refusal_not_an_overflow():
    from pdfleet.connector.adapter.params import own_lease_to_release, release_target, sign_params, verify_params
    from pdfleet.connector.transfer.auth import KeyRing

    ring = KeyRing(b"k" * 32)
    huge = {**_signed(), "remote_lease_seconds": 10**400}
    with pytest.raises(InvalidTransferParams, match="pdfleet_signature"):
        verify_params(huge, ring)
    with pytest.raises(InvalidTransferParams, match="pdfleet_signature"):
        sign_params(huge, b"k" * 32)
    assert release_target(huge, ring) is None
    with pytest.raises(InvalidTransferParams, match="pdfleet_signature"):
        own_lease_to_release(huge, engine_id="prefill-0", ring=ring)
