"""Who may call the Endpoint Picker (connector/epp/caller_auth.py): the pure check and the setting."""

from __future__ import annotations

import pytest

from pdfleet.connector.epp import caller_auth
from pdfleet.connector.epp.caller_auth import MISMATCH, MISSING, REPEATED, CallerTokenError
from pdfleet.contract.gateway import CALLER_TOKEN_METADATA as KEY

TOKEN = "0123456789abcdef" * 4
LAST_BYTE = TOKEN[:-1] + "0"  # differs from TOKEN in its last character only


@pytest.mark.parametrize("metadata, reason", [
    ([(KEY, TOKEN)], None),
    ([(KEY, TOKEN.encode())], None),  # a value as bytes
    ([(KEY.upper(), TOKEN)], None),  # gRPC keys are case-insensitive
    ([("user-agent", "envoy"), (KEY, TOKEN), ("x-request-id", "1")], None),
    ([], MISSING),
    ([("authorization", f"Bearer {TOKEN}")], MISSING),  # the token under another key
    ([(KEY, "")], MISMATCH),
    ([(KEY, LAST_BYTE)], MISMATCH),
    ([(KEY, TOKEN[:-1])], MISMATCH),  # a prefix
    ([(KEY, TOKEN + "0")], MISMATCH),  # an extension
    ([(KEY, TOKEN.upper())], MISMATCH),  # values are compared exactly
    ([(KEY, TOKEN), (KEY, TOKEN)], REPEATED),
    ([(KEY, LAST_BYTE), (KEY, TOKEN)], REPEATED),  # no second try inside one call
])
def test_verdict(metadata, reason):
    assert caller_auth.verdict(metadata, TOKEN.encode()) == reason


def test_verdict_compares_in_constant_time(monkeypatch):
    """The comparison is hmac.compare_digest's (its time does not depend on where the values differ)."""
    calls = []
    monkeypatch.setattr(caller_auth.hmac, "compare_digest", lambda a, b: calls.append((a, b)) or False)
    assert caller_auth.verdict([(KEY, LAST_BYTE)], TOKEN.encode()) == MISMATCH
    assert calls == [(LAST_BYTE.encode(), TOKEN.encode())]


@pytest.mark.parametrize("method, open_", [
    ("/grpc.health.v1.Health/Check", True),
    ("/grpc.health.v1.Health/Watch", True),
    ("/envoy.service.ext_proc.v3.ExternalProcessor/Process", False),
    ("/grpc.health.v1.HealthX/Check", False),
    ("/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", False),  # unknown methods too
    ("", False),
])
def test_only_health_is_open(method, open_):
    assert caller_auth.is_open(method) is open_


@pytest.mark.parametrize("token, any_caller, result", [
    (TOKEN, False, TOKEN),
    ("A-b.c_d~e+f/g=" * 3, False, "A-b.c_d~e+f/g=" * 3),  # a bearer token's characters
    (None, True, None),  # served to any caller: only when asked for
])
def test_caller_token(token, any_caller, result):
    assert caller_auth.caller_token(token, any_caller=any_caller) == result


@pytest.mark.parametrize("token, any_caller, match", [
    (None, False, "PDFLEET_EPP_CALLER_TOKEN is not set.*--insecure-any-caller"),
    (TOKEN[:31], False, "at least 32 characters"),
    (TOKEN[:-1] + " ", False, "a letter, a digit"),
    (TOKEN[:-1] + '"', False, "a letter, a digit"),
    (TOKEN[:-1] + "é", False, "a letter, a digit"),
    (TOKEN, True, "exclude each other"),
])
def test_caller_token_refused(token, any_caller, match):
    with pytest.raises(CallerTokenError, match=match):
        caller_auth.caller_token(token, any_caller=any_caller)
