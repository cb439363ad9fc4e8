"""What `pdfleet local --gateway` starts (connector/epp/local_gateway.py), in front of fake engines."""

from __future__ import annotations

import asyncio

from pdfleet.connector.epp.envoy_config import message_timeout_for
from pdfleet.connector.epp.local_gateway import LocalGateway
from pdfleet.contract import metrics as names
from pdfleet.contract.router_config import RouterConfig
from pdfleet.operator.observability.metrics_text import samples, total


async def test_local_gateway_serves_p_d_and_counts_like_the_router(gw):
    """Served through Envoy and the EPP, and counted as the router counts (issue 38): the per-revision
    series the canary and the planner read, TTFT and the route's requests, on the EPP's /metrics that
    `pdfleet local --gateway` names. Negative control: before one pipeline served both front ends, the
    EPP wrote none of these series (the counts below were 0)."""
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    local = LocalGateway(RouterConfig(prefill=(p.url,), decode=(d.url,)))
    try:
        url = await local.start()
        for path, body in (("/v1/completions", {"prompt": "hi", "max_tokens": 2}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
                           ("/v1/completions", {"prompt": "hi", "max_tokens": 2, "stream": True})):
            async with gw.session.post(url + path, json=body) as r:
                assert r.status == 200
                await r.read()
        answered = {names.REVISION_OUTCOME: names.OUTCOME_ANSWERED}
        for _ in range(100):  # the proxy's last message may reach the EPP after the client read the answer
            async with gw.session.get(local.metrics_url) as r:
                found = samples(await r.text())
            if total(found, f"{names.ROUTER_REVISION_REQUESTS}_total", revision="static", **answered) >= 3:
                break
            await asyncio.sleep(0.05)
        assert total(found, f"{names.ROUTER_REVISION_REQUESTS}_total", revision="static", **answered) == 3
        assert total(found, "pdfleet_router_requests_total", route="/v1/completions", code="200") == 2
        assert total(found, f"{names.ROUTER_TTFT}_count", revision="static") == 3
    finally:
        await local.stop()


def test_message_timeout_covers_every_prefill_attempt_and_the_queue():
    assert message_timeout_for(120.0, 2, 30.0) > 30.0 + 2 * 120.0
    assert message_timeout_for(120.0, 0) > 120.0  # at least one attempt
