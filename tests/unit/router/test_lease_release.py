"""The router's release request and how it reads the prefill's answer (pure)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from pdfleet.connector.serving import lease_release as lr
from pdfleet.contract.kv_params import RELEASE_KEY, error_params, release_reply

PARAMS = {"remote_engine_id": "p0", "remote_request_id": "cmpl-1", "pdfleet_signature": "v1.aa.bb"}


def test_release_body_is_one_token_with_the_params_as_signed():
    body = lr.release_body({"model": "m", "prompt": "a long prompt", "stream": True, "n": 3}, PARAMS)
    assert body == {"model": "m", "prompt": [0], "max_tokens": 1, "stream": False,
                    "kv_transfer_params": {**PARAMS, RELEASE_KEY: True}}
    assert RELEASE_KEY not in PARAMS  # the router's copy is not changed
    assert "model" not in lr.release_body({}, PARAMS)


def _answer(params):
    return msgspec.json.encode({"id": "x", "choices": [], "kv_transfer_params": params})


@pytest.mark.parametrize("status, data, outcome", [
    (200, _answer(release_reply()), lr.ACCEPTED),
    (200, _answer(error_params("kv_transfer_params.remote_engine_id: names engine 'p1'")), lr.REFUSED),
    (200, _answer(None), lr.UNSUPPORTED),  # a connector without releases computed it like any request
    (200, _answer({RELEASE_KEY: "yes"}), lr.UNSUPPORTED),
    (200, b"not json", lr.FAILED),
    (200, b"[1, 2]", lr.FAILED),
    (500, _answer(release_reply()), lr.FAILED),
    (400, b"{}", lr.FAILED),
    (None, b"", lr.FAILED),
    (200, None, lr.FAILED),  # an answer past the bound (read_bounded gave up)
    (200, b'{"kv_transfer_params": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", lr.FAILED),  # nested past the bound
])
def test_release_outcome(status, data, outcome):
    assert lr.release_outcome(status, data) == outcome


async def test_background_is_bounded():
    gate = asyncio.Event()
    bg = lr.Background(limit=2)

    async def work():
        await gate.wait()

    assert [bg.start(work) for _ in range(3)] == [True, True, False]
    gate.set()
    await bg.settle()
    assert bg.start(work)  # room again
    await bg.close()
