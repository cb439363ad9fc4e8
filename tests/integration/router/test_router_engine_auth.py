"""The engines answer only the fleet (issue 30): with PDFLEET_ENGINE_API_KEY set (the operator fills it
from the fleet's Secret), every request the router sends an engine (prefill leg, decode leg,
/v1/models; lease releases go through the same session) carries the fleet's bearer token instead of
the client's Authorization, checked with vLLM 0.32's own token check (its AuthenticationMiddleware, which
--api-key / VLLM_API_KEY switch on). Without the variable nothing changes (`pdfleet local`)."""

from __future__ import annotations

import pytest
from starlette.datastructures import Headers
from vllm.entrypoints.serve.middleware.authenticate import GUARDED_PREFIX, AuthenticationMiddleware

from pdfleet.connector.serving.engine_auth import EngineTokenError, engine_token
from pdfleet.contract.env import ENGINE_API_KEY

TOKEN = "3f" * 32  # as the operator generates it: 32 random bytes, hex


def vllm_accepts(received, token: str = TOKEN) -> bool:
    return AuthenticationMiddleware(app=None, tokens=[token]).verify_token(Headers(headers=dict(received.headers)))


async def test_every_engine_request_carries_the_fleets_token(fleet, monkeypatch):
    monkeypatch.setenv(ENGINE_API_KEY, TOKEN)
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    body = {"model": "m", "prompt": "hello there", "max_tokens": 2}
    client = {"Authorization": "Bearer the-clients-own-key"}
    async with fleet.session.post(url + "/v1/completions", json=body, headers=client) as resp:
        assert resp.status == 200, await resp.text()
    async with fleet.session.post(url + "/v1/completions", json=body) as resp:  # no client credentials
        assert resp.status == 200
    async with fleet.session.get(url + "/v1/models", headers=client) as resp:
        assert resp.status == 200
    received = p.received + d.received
    assert len(p.received) == 2 and len(d.received) == 3
    assert all(r.headers["Authorization"] == f"Bearer {TOKEN}" for r in received)
    assert all(vllm_accepts(r) for r in received)
    assert not any("the-clients-own-key" in str(dict(r.headers)) for r in received)


async def test_without_the_variable_the_engines_would_refuse(fleet, monkeypatch):
    """Negative control: the same requests without the router's token fail vLLM's check."""
    monkeypatch.delenv(ENGINE_API_KEY, raising=False)
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode")
    url = await fleet.router([p], [d])
    async with fleet.session.post(url + "/v1/completions", json={"model": "m", "prompt": "hi", "max_tokens": 2},
                                  headers={"Authorization": "Bearer guess"}) as resp:
        assert resp.status == 200  # fake engines do not check; vLLM would answer 401
    assert p.received and d.received
    assert not any(vllm_accepts(r) for r in p.received + d.received)


def test_vllm_guards_the_api_and_leaves_probes_and_metrics_open() -> None:
    """The decision in docs/operator.md holds for the installed vLLM: kubelet's /health and
    Prometheus' /metrics need no token, the OpenAI API under /v1 does."""
    assert "/v1" in GUARDED_PREFIX
    assert not any(path.startswith(GUARDED_PREFIX) for path in ("/health", "/metrics", "/ping"))


@pytest.mark.parametrize("value,token", [
    (None, None), ("", None), ("  ", None), (TOKEN, TOKEN), (f" {TOKEN}\n", TOKEN),
])
def test_engine_token(value, token) -> None:
    assert engine_token({} if value is None else {ENGINE_API_KEY: value}) == token


@pytest.mark.parametrize("value", ["a b", "tok\r\nX-Evil: 1", "é", "x" * 513])
def test_a_malformed_token_is_refused_by_name(value) -> None:
    with pytest.raises(EngineTokenError, match=ENGINE_API_KEY):
        engine_token({ENGINE_API_KEY: value})
