"""The waiting room through the gateway (issue 41): a real Envoy, the Endpoint Picker with a discovery the
test drives from zero, and counting fake engines; the same checks as the router's
(tests/support/waiting_room_checks.py), through the one serving pipeline."""

from __future__ import annotations

import asyncio

import pytest
from waiting_room_checks import COMPLETION, Publisher, burst_is_held_then_served, expired_wait_is_answered

from pdfleet.connector.epp.envoy_config import BUFFERED, FULL_DUPLEX
from pdfleet.contract import scale_to_zero as stz

pytestmark = pytest.mark.timeout(90)


async def gateway(gw, pub: Publisher, mode: str = BUFFERED, **overrides):
    p = await gw.engine("p0", "prefill")
    d = await gw.engine("d0", "decode")
    gw.discovery = pub
    await gw.start([p], [d], mode=mode, **overrides)
    await asyncio.wait_for(pub.started.wait(), 5)
    return p, d


def poster(gw):
    async def post(body, headers):
        async with gw.session.post(gw.url + "/v1/completions", json=body, headers=headers) as resp:
            return resp.status, resp.headers.copy(), await resp.read()
    return post


@pytest.mark.parametrize("mode", [BUFFERED, FULL_DUPLEX])
async def test_a_burst_at_zero_is_held_and_served_once_the_pair_is_ready(gw, mode):
    pub = Publisher()
    p, d = await gateway(gw, pub, mode, scale_to_zero_max_waiting=50)
    await burst_is_held_then_served(poster(gw), pub, [p], [d], n=20)


async def test_no_endpoint_in_time_is_a_503_with_the_reason(gw):
    pub = Publisher()
    await gateway(gw, pub, scale_to_zero_max_waiting=5, scale_to_zero_activation_timeout_s=0.5)
    await expired_wait_is_answered(poster(gw), pub, 503, stz.REJECTED_NO_ENDPOINTS)


async def test_negative_control_the_room_off_answers_503_at_once(gw):
    pub = Publisher()
    await gateway(gw, pub)  # scale_to_zero_max_waiting=0 (the default)
    status, headers, _ = await asyncio.wait_for(poster(gw)(COMPLETION, {}), 10)
    assert status == 503 and stz.DROPPED_REASON_HEADER not in headers
    assert pub.sample(stz.ROUTER_ACTIVATIONS + "_total") == 0
