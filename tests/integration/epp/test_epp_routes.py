"""One rule for the routes a fleet serves, in both front ends (issue 38): the generate routes run the
pipeline, /v1/models passes through to a decode, and every other path is 404 in OpenAI's shape from
the router and, through a real Envoy, from the Endpoint Picker: vLLM 0.32's /v1/messages,
/v1/responses and /v1/chat/completions/batch neither skip flow control and P/D nor reach an engine
with the fleet's token.

Negative control: before, the Endpoint Picker sent every other path to a decode untouched, with the
client's kv_transfer_params and the fleet's engine token (the decode's `received` below was not empty)."""

from __future__ import annotations

import pytest

from pdfleet.connector.router.app import start_router
from pdfleet.contract.router_config import RouterConfig

OTHER = ["/v1/messages", "/v1/responses", "/v1/chat/completions/batch", "/v1/embeddings", "/tokenize"]
BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "kv_transfer_params": {"do_remote_prefill": True, "remote_engine_id": "forged"}}


@pytest.mark.parametrize("front", ["gateway", "router"])
async def test_every_other_route_is_404_and_reaches_no_engine(gw, front):
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    url = await gw.start([p], [d])
    runner = None
    if front == "router":
        runner, port = await start_router(RouterConfig(prefill=(p.url,), decode=(d.url,)), "127.0.0.1", 0)
        url = f"http://127.0.0.1:{port}"
    try:
        for path in OTHER:
            async with gw.session.post(url + path, json=BODY) as r:
                assert r.status == 404, (front, path, r.status)
                err = (await r.json())["error"]
                assert path in err["message"] and "/v1/completions" in err["message"], err
        async with gw.session.get(url + "/v1/completions") as r:
            assert r.status == 405 and r.headers["allow"] == "POST"
        assert p.received == [] and d.received == [], "an unserved route reached an engine"
        # the routes served still are: generate through P/D, /v1/models to a decode
        async with gw.session.post(url + "/v1/chat/completions", json=BODY) as r:
            assert r.status == 200
            assert (await r.json())["kv_seen"]["remote_engine_id"] == "p1"  # the client's params were dropped
        async with gw.session.get(url + "/v1/models") as r:
            assert r.status == 200
    finally:
        if runner is not None:
            await runner.cleanup()
