"""The fleet key's signature over kv_transfer_params (issue 19; connector/adapter/signed_params.py), and
the contract's strict readers with it (``verify``): pure, no vLLM engine."""

from __future__ import annotations

import pytest
from kv_params_cases import BS, MONO, NOW, OLD, good

from pdfleet.connector.adapter.signed_params import sign_params, verifier, verify_params
from pdfleet.connector.transfer.auth import KeyRing
from pdfleet.contract.kv_params import (
    SIG_KEY,
    SIGNED_FIELDS,
    SIGNED_FIELDS_V1,
    InvalidTransferParams,
    own_lease_to_release,
    parse_remote_prefill,
    produce,
    release_target,
)


# -- signed params (issue 19) ------------------------------------------------------------------------
def _signed(key: bytes = b"k" * 32) -> dict:
    p = produce(block_ids=[4, 5, 6], engine_id="prefill-0", request_id="cmpl-1", host="10.0.0.7", port=5600,
                tp_size=1, instance_id="i0", lease_seconds=30, num_tokens=40, hosts=())
    p[SIG_KEY] = sign_params(p, key)
    return p


def _signed_1_2(key: bytes = b"k" * 32) -> dict:
    """What a not yet upgraded (1.2) prefill returns: a unix expiry, signed v1."""
    p = produce(block_ids=[4, 5, 6], engine_id="prefill-0", request_id="cmpl-1", host="10.0.0.7", port=5600,
                tp_size=1, instance_id="i0", lease_seconds=30, num_tokens=40, hosts=())
    del p["remote_lease_seconds"]
    p |= {"pdfleet_params_version": "1.2", "remote_lease_expiry": NOW + 30}
    p[SIG_KEY] = sign_params(p, key, "v1")
    return p


def test_signed_params_verify_after_a_json_round_trip():
    import json

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
    p = _signed()
    if sig is None:
        del p[SIG_KEY]
    else:
        p[SIG_KEY] = sig
    with pytest.raises(InvalidTransferParams, match=problem):
        verify_params(p, KeyRing(b"k" * 32))


def test_parse_checks_the_signature_with_a_ring_and_bounds_expiry_first():
    ring = KeyRing(b"k" * 32)
    ok = parse_remote_prefill(_signed(), num_prompt_tokens=40, block_size=BS, local_tp_size=1, now=NOW, verify=verifier(ring))
    assert ok.remote_block_ids == (4, 5, 6)
    with pytest.raises(InvalidTransferParams, match="remote_lease_seconds.*3600"):
        parse_remote_prefill({**_signed(), "remote_lease_seconds": 1e308}, num_prompt_tokens=40, block_size=BS,
                             local_tp_size=1, now=NOW, verify=verifier(ring))
    with pytest.raises(InvalidTransferParams, match="remote_lease_expiry.*ahead"):
        parse_remote_prefill({**_signed_1_2(), "remote_lease_expiry": 1e308}, num_prompt_tokens=40, block_size=BS,
                             local_tp_size=1, now=NOW, verify=verifier(ring))
    with pytest.raises(InvalidTransferParams, match="pdfleet_signature"):
        parse_remote_prefill(_signed(b"x" * 32), num_prompt_tokens=40, block_size=BS, local_tp_size=1, now=NOW,
                             verify=verifier(ring))


def test_a_1_3_decode_verifies_a_1_2_prefills_v1_signature():
    """Rolling upgrade: a 1.2 prefill (v1 over SIGNED_FIELDS_V1) is still pulled from by a 1.3 decode."""
    ring = KeyRing(b"k" * 32)
    old = _signed_1_2()
    assert old["pdfleet_signature"].startswith("v1.") and _signed()["pdfleet_signature"].startswith("v3.")
    assert set(SIGNED_FIELDS) - set(SIGNED_FIELDS_V1) == {"remote_lease_seconds", "pdfleet_params_version",
                                                          "remote_lease_id"}
    r = parse_remote_prefill(old, num_prompt_tokens=40, block_size=BS, local_tp_size=1, now=NOW, verify=verifier(ring),
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
                             local_tp_size=1, now=NOW, verify=verifier(ring), accepted_at=MONO)
    assert r.remote_lease_seconds is None and r.lease_deadline is None


def test_release_target_only_for_params_a_fleet_key_signed():
    ring = KeyRing(b"k" * 32)
    good = _signed()
    assert release_target(good, verifier(ring)) == ("10.0.0.7", 5600, 1, "cmpl-1", ())
    assert release_target(good, verifier(None)) is None  # no key: never dial what a client named
    assert release_target({**good, "remote_host": "169.254.169.254"}, verifier(ring)) is None  # altered
    assert release_target({k: v for k, v in good.items() if k != SIG_KEY}, verifier(ring)) is None
    huge = {**good, "remote_block_ids": [list(range(100_000))]}
    huge[SIG_KEY] = sign_params(huge, b"k" * 32)
    assert release_target(huge, verifier(ring)) is None  # too many ids to be worth an HMAC
    assert release_target(["not", "a", "mapping"], verifier(ring)) is None


def _own_release(params, ring, engine_id="prefill-0"):
    try:
        return own_lease_to_release(params, engine_id=engine_id, verify=verifier(ring))
    except InvalidTransferParams as exc:
        return exc.field


def _resigned(params):
    out = {k: v for k, v in params.items() if k != SIG_KEY}
    out[SIG_KEY] = sign_params(out, b"k" * 32)
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
    assert _own_release(make(), KeyRing(b"k" * 32) if keyed else None) == expected


# -- single-use leases (params 1.4, issue 30) ---------------------------------------------------------
def _signed_1_3(key: bytes = b"k" * 32) -> dict:
    """What a not yet upgraded (1.3) prefill returns: no lease id, signed v2."""
    p = produce(block_ids=[4, 5, 6], engine_id="prefill-0", request_id="cmpl-1", host="10.0.0.7", port=5600,
                tp_size=1, instance_id="i0", lease_seconds=30, num_tokens=40)
    del p["remote_lease_id"]
    p["pdfleet_params_version"] = "1.3"
    p[SIG_KEY] = sign_params(p, key, "v2")
    return p

def test_rolling_upgrade_a_1_4_decode_reads_a_1_3_prefills_params_the_1_3_way():
    ring = KeyRing(b"k" * 32)
    r = parse_remote_prefill(_signed_1_3(), num_prompt_tokens=40, block_size=BS, local_tp_size=1, now=NOW, verify=verifier(ring),
                             accepted_at=MONO)
    assert r.remote_lease_id is None and r.lease_deadline == MONO + 30  # no lease id: pulled as 1.3
    # v2 does not cover a lease id: one added to 1.3 params is not read (nothing gained) ...
    r = parse_remote_prefill({**_signed_1_3(), "remote_lease_id": "ab" * 16}, num_prompt_tokens=40, block_size=BS,
                             local_tp_size=1, now=NOW, verify=verifier(ring))
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
    base = {**good(), **OLD} if field == "remote_lease_expiry" else good()
    for ring in (None, KeyRing(b"k" * 32)):
        with pytest.raises(InvalidTransferParams) as exc:
            parse_remote_prefill({**base, field: value}, num_prompt_tokens=80, block_size=BS, local_tp_size=1, now=NOW,
                                 verify=verifier(ring), accepted_at=MONO)
        assert exc.value.field == field and len(str(exc.value)) < 200  # a 400-digit number is not echoed


def test_signing_or_releasing_params_with_a_huge_number_is_a_refusal_not_an_overflow():
    ring = KeyRing(b"k" * 32)
    huge = {**_signed(), "remote_lease_seconds": 10**400}
    with pytest.raises(InvalidTransferParams, match="pdfleet_signature"):
        verify_params(huge, ring)
    with pytest.raises(InvalidTransferParams, match="pdfleet_signature"):
        sign_params(huge, b"k" * 32)
    assert release_target(huge, verifier(ring)) is None
    with pytest.raises(InvalidTransferParams, match="pdfleet_signature"):
        own_lease_to_release(huge, engine_id="prefill-0", verify=verifier(ring))