"""What `pdfleet local --gateway` starts (connector/epp/local_gateway.py), in front of fake engines."""

from __future__ import annotations

from pdfleet.connector.epp.envoy_config import message_timeout_for
from pdfleet.connector.epp.local_gateway import LocalGateway
from pdfleet.contract.router_config import RouterConfig


async def test_local_gateway_serves_p_d(gw):
    p = await gw.engine("p1", "prefill")
    d = await gw.engine("d1", "decode")
    local = LocalGateway(RouterConfig(prefill=(p.url,), decode=(d.url,)))
    try:
        url = await local.start()
        async with gw.session.post(url + "/v1/completions", json={"prompt": "hi", "max_tokens": 2}) as r:
            assert r.status == 200
            assert (await r.json())["kv_seen"]["remote_engine_id"] == "p1"
    finally:
        await local.stop()


def test_message_timeout_covers_every_prefill_attempt_and_the_queue():
    assert message_timeout_for(120.0, 2, 30.0) > 30.0 + 2 * 120.0
    assert message_timeout_for(120.0, 0) > 120.0  # at least one attempt
