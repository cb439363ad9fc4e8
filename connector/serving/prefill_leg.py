"""The prefill leg: one token, not streamed, KV kept for a remote decode; retried on another
prefill endpoint; and the hand-back of a leg whose client left (abandon.py).

The leg sends prefill only what makes the KV (abandon.one_token_body drops what only sizes the
answer) and reads at most ``MAX_PREFILL_ANSWER_BYTES`` of the answer, of which it decodes only
``kv_transfer_params`` (msgspec skips the rest in C). A longer answer (an engine that ignores the
drop, or a field not yet known to size it) is refused: the client gets 502, the leg counts as a
failure ``answer_too_large`` (not retried: another prefill would answer the same; not ejected: the
endpoint is healthy), and prefill's blocks stay leased until the lease ends, since releasing them
takes the signed kv_transfer_params the leg did not read.
"""

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
from pdfleet.connector.serving.errors import error_body
from pdfleet.connector.serving.json_depth import check_depth
from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.connector.serving.picker import Picker
from pdfleet.connector.serving.upstream import REQUEST_ID_HEADER, RETRYABLE_4XX, json_encode, read_bounded, target
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
    client_error: UpstreamAnswer | None = None  # a 4xx from prefill relayed as is, or too_large_answer()
    url: str | None = None  # the prefill that holds the lease
    # When the response arrived: monotonic (the lease's clock, kv_params.lease_deadline) and, for
    # params <= 1.2 that carry a unix expiry, the wall clock at the same moment.
    received_at: float | None = None
    wall_at_receipt: float | None = None


# A one-token answer without the answer-sizing fields is about 1 KB; 1 MiB leaves room for any
# engine's extra fields and bounds what a request can make the router hold and parse.
MAX_PREFILL_ANSWER_BYTES = 1024 * 1024
ANSWER_TOO_LARGE = "answer_too_large"  # leg_failures reason


class _Answer(msgspec.Struct):
    kv_transfer_params: Any = None  # the one field the leg uses; msgspec skips the others unbuilt


_decode_answer = msgspec.json.Decoder(_Answer).decode


def answer_kv_params(data: bytes) -> Any:
    """``kv_transfer_params`` of prefill's answer (None if absent); msgspec.DecodeError if the answer is
    not a JSON object (or nests past json_depth's bound: msgspec recurses into skipped values too)."""
    check_depth(data)
    return _decode_answer(data).kv_transfer_params


def too_large_answer(limit: int = MAX_PREFILL_ANSWER_BYTES) -> UpstreamAnswer:
    """What the client gets for a prefill answer longer than ``limit``."""
    return UpstreamAnswer(502, error_body(502, f"prefill's answer exceeds the limit of {limit} bytes"),
                          "application/json")


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
    def prefill_body(body: dict[str, Any], *, chat: bool, reuse: dict[str, Any] | None = None) -> dict[str, Any]:
        """The prefill leg's body: one token, not streamed, KV kept for a remote decode; ``reuse``: the keys
        of the last turn's decode offer (turn_reuse.py), when there is one to pull from."""
        return one_token_body(body, remote_decode_request() | (reuse or {}), chat=chat)

    async def run(self, group: RevisionEndpoints, path: str, body: dict[str, Any],
                           headers: dict[str, str], *, chat: bool, reuse: dict[str, Any] | None = None) -> PrefillResult:
        payload = json_encode(self.prefill_body(body, chat=chat, reuse=reuse))
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
                data = await read_bounded(resp, MAX_PREFILL_ANSWER_BYTES)
                if resp.status >= 500 or resp.status in RETRYABLE_4XX:
                    return f"http_{resp.status}"
                if data is None:
                    resp.close()  # the rest is not read: the connection cannot be reused
                    return self._too_large(url, headers)
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
            params = answer_kv_params(data)
        except msgspec.DecodeError:
            return "invalid_json"
        if not isinstance(params, dict):
            return "no_kv_transfer_params"
        return PrefillResult(kv_transfer_params=params, received_at=received_at, wall_at_receipt=wall_at_receipt)

    def _too_large(self, url: str, headers: dict[str, str]) -> PrefillResult:
        self.metrics.leg_failures.labels(PREFILL, ANSWER_TOO_LARGE).inc()
        log.warning("prefill %s answered more than %d bytes, request %s: refused (its lease runs its course)",
                    url, MAX_PREFILL_ANSWER_BYTES, headers[REQUEST_ID_HEADER])
        return PrefillResult(client_error=too_large_answer())

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
                await read_bounded(resp, MAX_PREFILL_ANSWER_BYTES)  # dropped: only the pull matters
        finally:
            self.picker.release(DECODE, url)
