"""The prefill leg: one token, not streamed, KV kept for a remote decode; retried on another
prefill endpoint; and the hand-back of a leg whose client left (abandon.py)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import aiohttp
import msgspec

from pdfleet.connector.serving.abandon import one_token_body, release_body
from pdfleet.connector.serving.endpoints import DECODE, PREFILL, RevisionEndpoints
from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.connector.serving.picker import Picker
from pdfleet.connector.serving.upstream import REQUEST_ID_HEADER, RETRYABLE_4XX, json_decode, json_encode, target
from pdfleet.contract.kv_params import remote_decode_request
from pdfleet.contract.router_config import RouterConfig

log = logging.getLogger("pdfleet.router")


@dataclass(frozen=True)
class UpstreamAnswer:
    """An engine's answer relayed as it is (a 4xx: the client's mistake)."""

    status: int
    body: bytes
    content_type: str


@dataclass
class PrefillResult:
    kv_transfer_params: dict[str, Any] | None = None
    client_error: UpstreamAnswer | None = None  # a 4xx from prefill, relayed as is
    url: str | None = None  # the prefill that holds the lease
    # When the response arrived: monotonic (the lease's clock, kv_params.lease_deadline) and, for
    # params <= 1.2 that carry a unix expiry, the wall clock at the same moment.
    received_at: float | None = None
    wall_at_receipt: float | None = None


class PrefillLeg:
    """The prefill leg of a request, on the endpoints the picker chooses. Its collaborators: the
    picker (choice, load, ejection), the router's metrics and upstream session, and the latency
    histogram of the leg."""

    def __init__(self, config: RouterConfig, picker: Picker, metrics: RouterMetrics,
                 session: Callable[[], aiohttp.ClientSession]) -> None:
        self.config = config
        self.picker = picker
        self.metrics = metrics
        self._session = session
        self._latency = metrics.leg_latency.labels(PREFILL)
        self._timeout = aiohttp.ClientTimeout(total=config.prefill_timeout_s, sock_connect=config.connect_timeout_s)

    @property
    def session(self) -> aiohttp.ClientSession:
        return self._session()

    @staticmethod
    def prefill_body(body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
        """The prefill leg's body: one token, not streamed, KV kept for a remote decode."""
        return one_token_body(body, remote_decode_request(), chat=chat)

    async def run(self, group: RevisionEndpoints, path: str, body: dict[str, Any],
                           headers: dict[str, str], *, chat: bool) -> PrefillResult:
        payload = json_encode(self.prefill_body(body, chat=chat))
        candidates = group.ready(PREFILL)
        tried: set[str] = set()
        for attempt in range(self.config.prefill_attempts):
            url = self.picker.pick(PREFILL, candidates, tried, body, chat)
            if url is None:
                break
            tried.add(url)
            if attempt:
                self.metrics.retries.labels(PREFILL).inc()
            reason = await self._one(url, path, payload, headers)
            if isinstance(reason, PrefillResult):
                reason.url = url
                return reason
            self.metrics.leg_failures.labels(PREFILL, reason).inc()
            self.picker.eject(url)
            log.warning("prefill leg to %s failed (%s), request %s", url, reason, headers[REQUEST_ID_HEADER])
        return PrefillResult()

    async def _one(self, url: str, path: str, payload: bytes,
                           headers: dict[str, str]) -> PrefillResult | str:
        """One prefill attempt: a result, or the reason it failed."""
        started = time.perf_counter()
        self.picker.acquire(PREFILL, url)
        try:
            async with self.session.post(target(url, path), data=payload, headers=headers,
                                         timeout=self._timeout) as resp:
                received_at, wall_at_receipt = time.monotonic(), time.time()  # the headers: the earliest sign
                data = await resp.read()
                if resp.status >= 500 or resp.status in RETRYABLE_4XX:
                    return f"http_{resp.status}"
                if resp.status >= 400:
                    return PrefillResult(client_error=UpstreamAnswer(
                        resp.status, data, resp.content_type or "application/json"))
        except asyncio.TimeoutError:
            return "timeout"
        except aiohttp.ClientConnectionError:
            return "connect"
        except aiohttp.ClientError:
            return "protocol"
        finally:
            self.picker.release(PREFILL, url)
            self._latency.observe(time.perf_counter() - started)
        try:
            params = json_decode(data).get("kv_transfer_params")
        except (msgspec.DecodeError, AttributeError):
            return "invalid_json"
        if not isinstance(params, dict):
            return "no_kv_transfer_params"
        return PrefillResult(kv_transfer_params=params, received_at=received_at, wall_at_receipt=wall_at_receipt)

    async def hand_back(self, group: RevisionEndpoints, path: str, body: dict[str, Any], headers: dict[str, str],
                         kv_params: dict[str, Any], *, chat: bool) -> None:
        """One-token decode leg whose only purpose is to consume (and so release) prefill's blocks."""
        url = self.picker.pick(DECODE, group.ready(DECODE), set())
        if url is None:
            return
        self.picker.acquire(DECODE, url)
        try:
            async with self.session.post(target(url, path), headers=headers,
                                         data=json_encode(release_body(body, kv_params, chat=chat)),
                                         timeout=self._timeout) as resp:
                await resp.read()
        finally:
            self.picker.release(DECODE, url)
