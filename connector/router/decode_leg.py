"""The decode leg: prefill's kv_transfer_params to a decode, retried on another while nothing reached
the client (with the params while their lease lasts), the answer relayed chunk by chunk; and the
release of a lease no decode will read (lease_release.py)."""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from typing import Any, Callable

import aiohttp
from aiohttp import web

from pdfleet.connector.serving import lease_release, timing
from pdfleet.connector.serving.endpoints import DECODE, RevisionEndpoints, lease_allows_reuse
from pdfleet.connector.serving.errors import error_response
from pdfleet.connector.serving.lease_release import Lease
from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.connector.serving.outcome import StreamEnd
from pdfleet.connector.serving.picker import Picker
from pdfleet.connector.serving.upstream import (
    CLIENT_LEFT,
    DELIVERED,
    REQUEST_ID_HEADER,
    RETRYABLE_4XX,
    WHOLE_BODY_MAX,
    json_encode,
    target,
)
from pdfleet.contract.router_config import RouterConfig
from pdfleet.contract.routing import FALLBACK_DECODE_ONLY, FALLBACK_HEADER

log = logging.getLogger("pdfleet.router")


class BrokeBeforeFirstByte(Exception):
    """Decode's answer broke while the router still held all of it back."""


class DecodeLeg:
    """The decode leg of a request, on the endpoints the picker chooses, relayed to the client.
    Its collaborators: the picker, the lease releaser, the router's metrics and upstream session."""

    def __init__(self, config: RouterConfig, picker: Picker, metrics: RouterMetrics,
                 session: Callable[[], aiohttp.ClientSession], releaser: lease_release.LeaseReleaser) -> None:
        self.config = config
        self.picker = picker
        self.metrics = metrics
        self._session = session
        self.releaser = releaser
        self._latency = metrics.leg_latency.labels(DECODE)
        self._first_byte = metrics.leg_latency.labels("decode_first_byte")

    @property
    def session(self) -> aiohttp.ClientSession:
        return self._session()

    async def run(self, request: web.Request, group: RevisionEndpoints, path: str,
                          body: dict[str, Any], headers: dict[str, str], reply_headers: dict[str, str],
                          kv_params: dict[str, Any] | None, lease: Lease | None,
                          remember: Callable[[str, bytes], bytes] | None = None) -> web.StreamResponse:
        """Decode with prefill's kv_params; ``lease`` (until a decode takes the request) is released at
        the prefill on every path where no decode will read it (lease_release.py). ``remember``: given the
        decode's URL and its whole answer when the answer is not streamed, returns what the client gets
        (turn_reuse.py: the offer kept, and taken out)."""
        try:
            return await self._attempts(request, group, path, body, headers, reply_headers, kv_params,
                                               lease, remember)
        except asyncio.CancelledError:
            if lease is not None and lease.params:  # the client left before a decode took the request
                self.releaser.release_unread(lease, body, headers, lease_release.CLIENT_GONE)
            raise

    def _may_reuse(self, kv_params: dict[str, Any], lease: Lease | None) -> bool:
        if lease is None or lease.received_at is None:
            return False  # no time of receipt: the lease cannot be placed on our clock
        return lease_allows_reuse(kv_params, time.monotonic(), self.config.lease_margin_s,
                                  received_at=lease.received_at, wall_at_receipt=lease.wall_at_receipt)

    async def _attempts(self, request: web.Request, group: RevisionEndpoints, path: str,
                               body: dict[str, Any], headers: dict[str, str], reply_headers: dict[str, str],
                               kv_params: dict[str, Any] | None, lease: Lease | None,
                               remember: Callable[[str, bytes], bytes] | None = None) -> web.StreamResponse:
        candidates = group.ready(DECODE)
        tried: set[str] = set()
        cfg = self.config
        for attempt in range(cfg.decode_attempts):
            url = self.picker.pick(DECODE, candidates, tried, body, path.endswith("chat/completions"))
            if url is None:
                break
            tried.add(url)
            if attempt:
                self.metrics.retries.labels(DECODE).inc()
                if kv_params is not None and not self._may_reuse(kv_params, lease):
                    kv_params = None
                    if lease is not None and lease.params:
                        self.releaser.release_unread(lease, body, headers, lease_release.LEASE_EXPIRED)
                    self.metrics.fallbacks.labels("lease_expired").inc()
                    timing.kv_fallback()
                    reply_headers[FALLBACK_HEADER] = FALLBACK_DECODE_ONLY
            decode_body = dict(body)
            if kv_params is not None:
                decode_body["kv_transfer_params"] = kv_params
            started = time.perf_counter()
            self.picker.acquire(DECODE, url)
            resp = None
            detail = ""
            try:
                try:
                    async with asyncio.timeout(cfg.decode_first_byte_timeout_s):
                        resp = await self.session.post(target(url, path), data=json_encode(decode_body), headers=headers)
                except asyncio.TimeoutError:
                    reason = "timeout"
                except aiohttp.ClientConnectionError as exc:
                    reason, detail = "connect", f": {exc!r}"
                except aiohttp.ClientError as exc:
                    reason, detail = "protocol", f": {exc!r}"
                else:
                    self._first_byte.observe(time.perf_counter() - started)
                    timing.first_byte()
                    if resp.status < 500 and resp.status not in RETRYABLE_4XX:
                        taken = None
                        if lease is not None and lease.params and kv_params is not None:
                            if resp.status >= 400:  # refused before its engine ran: it reads nothing
                                self.releaser.release_unread(lease, body, headers, lease_release.DECODE_REFUSED)
                            else:  # this decode reads the blocks (or releases them itself)
                                taken, lease.params = lease.params, {}
                        try:
                            return await self._relay(request, resp, reply_headers,
                                                     None if remember is None else functools.partial(remember, url))
                        except BrokeBeforeFirstByte:
                            reason = "broken_answer"  # nothing reached the client: another decode may serve
                            if taken is not None:
                                lease.params = taken  # the next decode may read them
                    else:
                        reason = f"http_{resp.status}"
                self.metrics.leg_failures.labels(DECODE, reason).inc()
                self.picker.eject(url)
                log.warning("decode leg to %s failed (%s%s), request %s", url, reason, detail[:300],
                            headers[REQUEST_ID_HEADER])
            finally:
                if resp is not None:
                    resp.release()
                self.picker.release(DECODE, url)
                self._latency.observe(time.perf_counter() - started)
        if lease is not None and lease.params:
            self.releaser.release_unread(lease, body, headers, lease_release.DECODE_FAILED)
        self.metrics.errors.labels("decode_failed").inc()
        return error_response(502, f"decode failed on {len(tried)} endpoint(s) of revision {group.revision}",
                              headers=reply_headers)

    async def _relay(self, request: web.Request, resp: aiohttp.ClientResponse,
                     reply_headers: dict[str, str], remember: Callable[[bytes], bytes] | None = None) -> web.StreamResponse:
        headers = dict(reply_headers)
        for name in ("Content-Type", "Content-Encoding", "Cache-Control"):
            value = resp.headers.get(name)
            if value is not None:
                headers[name] = value
        length = resp.content_length
        if length is not None and length <= WHOLE_BODY_MAX and not resp.content_type.endswith("event-stream"):
            # A sized, non-streamed answer arrives in one piece anyway: relay it as one write.
            try:
                async with asyncio.timeout(self.config.decode_idle_timeout_s):
                    data = await resp.read()
            except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
                raise BrokeBeforeFirstByte from exc
            timing.chunk(data)
            if remember is not None and resp.status == 200:
                data = remember(data)  # the offer kept, and taken out of the client's answer
            return web.Response(status=resp.status, body=data, headers=headers)
        out = web.StreamResponse(status=resp.status, headers=headers)
        if length is not None:
            out.content_length = length
        try:
            await out.prepare(request)
        except ConnectionError:
            return self._client_gone(request, resp, out)
        idle = self.config.decode_idle_timeout_s
        end = StreamEnd() if resp.content_type.endswith("event-stream") else None
        while True:
            try:
                async with asyncio.timeout(idle):
                    chunk = await resp.content.readany()
            except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
                # Headers are gone already: cut the client's connection so that
                # it cannot take a truncated answer for a complete one.
                self.metrics.errors.labels("decode_midstream").inc()
                log.warning("decode stream broke after the first byte: %r", exc)
                resp.close()
                if request.transport is not None:
                    request.transport.close()
                return out
            if not chunk:
                break
            try:
                await out.write(chunk)
                timing.chunk(chunk)
            except ConnectionError:
                return self._client_gone(request, resp, out)
            if end is not None and end.feed(chunk):  # [DONE] relayed: the client may close now
                request[DELIVERED] = resp.status
        request[DELIVERED] = resp.status  # decode's whole answer was written
        try:
            await out.write_eof()
        except ConnectionError:
            return self._client_gone(request, resp, out)
        return out

    def _client_gone(self, request: web.Request, resp: aiohttp.ClientResponse,
                     out: web.StreamResponse) -> web.StreamResponse:
        # Dropping the upstream connection makes decode abort the request.
        if DELIVERED not in request:
            self.metrics.client_disconnects.inc()
            request[CLIENT_LEFT] = True
        resp.close()
        return out
