"""The request id the router sends upstream (pure; issue 20 row 6)."""

from __future__ import annotations

import pytest

from pdfleet.contract.routing import MAX_ID_LEN
from pdfleet.connector.serving.request_id import MAX_CLIENT_ID_LEN, upstream_request_id


def fresh():
    return "NEW"


@pytest.mark.parametrize("client_id, expected", [
    ("abc-123", "abc-123"),
    ("x" * MAX_CLIENT_ID_LEN, "x" * MAX_CLIENT_ID_LEN),
    ("x" * (MAX_CLIENT_ID_LEN + 1), "NEW"),
    ("x" * 256, "NEW"),  # what main accepted: vLLM's id from it is 270+ characters, decode refuses it
    ("", "NEW"),
    (None, "NEW"),
    ("caf\u00e9", "NEW"),
    ("a\tb", "NEW"),
])
def test_upstream_request_id(client_id, expected):
    assert upstream_request_id(client_id, fresh) == expected


def test_vllms_longest_id_from_it_fits_decodes_limit():
    longest = f"chatcmpl-{'x' * MAX_CLIENT_ID_LEN}-0-{'r' * 8}"  # chat prefix, a prompt index, vLLM's suffix
    assert len(longest) <= MAX_ID_LEN
    assert len(upstream_request_id(None)) == 32  # uuid4 hex
