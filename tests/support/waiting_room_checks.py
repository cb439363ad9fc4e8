"""The waiting room's end-to-end checks (issue 41), shared by the router's and the gateway's tests: the same
scenario through either front end, with a discovery the test drives and counting fake engines."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from pdfleet.connector.serving.endpoints import Endpoint, RevisionEndpoints
from pdfleet.contract import scale_to_zero as stz
from pdfleet.contract.kv_params import wants_release
from pdfleet.contract.routing import FALLBACK_HEADER

COMPLETION = {"model": "tiny", "prompt": "hello there", "max_tokens": 7, "temperature": 0}
# post(body, headers) -> (status, response headers, raw body), through the front end under test
Post = Callable[[dict[str, Any], dict[str, str]], Awaitable[tuple[int, Any, bytes]]]


class Publisher:
    """A discovery the test drives: it publishes nothing until told (a fleet at zero)."""

    def __init__(self) -> None:
        self.state: Any = None
        self.started = asyncio.Event()

    async def __call__(self, state: Any) -> None:
        self.state = state
        self.started.set()
        await asyncio.Event().wait()

    def publish(self, prefill, decode, *, prefill_ready: bool = True) -> None:
        prefills = tuple(Endpoint(e.url, ready=prefill_ready) for e in prefill)
        self.state.set_endpoints([RevisionEndpoints("r1", prefills, tuple(Endpoint(e.url) for e in decode))])

    def sample(self, name: str, labels: dict[str, str] | None = None) -> float | None:
        return self.state.metrics.registry.get_sample_value(name, labels or {})

    async def until_waiting(self, count: int, timeout_s: float = 10.0) -> None:
        """Until the waiting gauge reads ``count`` (bounded)."""
        async with asyncio.timeout(timeout_s):
            while self.sample(stz.ROUTER_WAITING_REQUESTS) != count:
                await asyncio.sleep(0.01)


def generate_calls(engine) -> list[Any]:
    """The generate requests an engine received (not the router's lease releases)."""
    return [r for r in engine.received if r.body is not None and not wants_release(r.body.get("kv_transfer_params"))]


async def burst_is_held_then_served(post: Post, pub: Publisher, prefill, decode, n: int = 20) -> None:
    """A burst at zero is held (no answer, no engine called), still held while only decode is up (no
    decode-alone), then every request is answered 200 by P/D once the pair is ready: none lost, none
    duplicated."""
    ids = [f"held-{i}" for i in range(n)]
    tasks = [asyncio.create_task(post(COMPLETION, {"X-Request-Id": rid})) for rid in ids]
    await pub.until_waiting(n)
    assert not any(t.done() for t in tasks), "held, not answered"
    pub.publish(prefill, decode, prefill_ready=False)  # decode is up, prefill still waking
    await asyncio.sleep(0.2)
    assert not any(t.done() for t in tasks) and pub.sample(stz.ROUTER_WAITING_REQUESTS) == n
    assert not any(e.received for e in (*prefill, *decode)), "no engine called while the pair is not ready"
    pub.publish(prefill, decode)
    answers = await asyncio.wait_for(asyncio.gather(*tasks), 30)
    assert [status for status, _, _ in answers] == [200] * n
    assert all(FALLBACK_HEADER not in headers for _, headers, _ in answers), "none answered decode-alone"
    assert all(json.loads(raw)["kv_seen"] for _, _, raw in answers), "every decode got prefill's KV params"
    for role in (prefill, decode):  # each request exactly once per role: 0 lost, 0 duplicated
        seen = sorted(r.headers["X-Request-Id"] for e in role for r in generate_calls(e))
        assert seen == sorted(ids)
    assert pub.sample(stz.ROUTER_WAITING_REQUESTS) == 0
    assert pub.sample(stz.ROUTER_ACTIVATIONS + "_total") == 1  # one activation for the whole burst
    assert pub.sample(stz.ROUTER_ACTIVATION_WAIT + "_count") == 1


async def expired_wait_is_answered(post: Post, pub: Publisher, status: int, reason: str) -> None:
    got, headers, raw = await asyncio.wait_for(post(COMPLETION, {}), 10)
    assert (got, headers.get(stz.DROPPED_REASON_HEADER)) == (status, reason), raw
    assert json.loads(raw)["error"]["code"] == status
    assert ("Retry-After" in headers) is (status == 429)
    assert pub.sample(stz.ROUTER_WAITING_DROPPED + "_total", {stz.DROPPED_REASON: reason}) == 1
