"""The P/D router as an aiohttp application.

Each completion request becomes two legs against one revision of the fleet:

1. prefill leg: the client's body with ``max_tokens=1`` (and
   ``max_completion_tokens=1`` for chat), ``stream: false`` and
   ``kv_transfer_params: {"do_remote_decode": true}``; its response carries the
   ``kv_transfer_params`` that tell decode where the KV cache lies;
2. decode leg: the client's body plus those ``kv_transfer_params``; decode's
   response is relayed to the client chunk by chunk.

Both legs carry the same ``X-Request-Id``. Clients never set
``kv_transfer_params`` themselves: the router drops them.

Failures: a failed prefill leg (connect error, timeout, 5xx, 408/429, or a
response without kv_transfer_params) goes to another prefill endpoint, at most
``prefill_attempts`` in all; then decode serves alone (the body without
kv_transfer_params, so decode prefills locally), marked ``x-pdfleet-fallback:
decode-only``. A decode leg that fails before the router sent any byte goes to
another decode endpoint (``decode_attempts`` in all) with prefill's
kv_transfer_params while their lease (``remote_lease_expiry`` in
pdfleet.contract.kv_params) has ``lease_margin_s`` left, else decode-only. A 4xx
from either leg is the client's mistake and is relayed as is.

A request that vLLM splits into several engine requests (``n > 1``, several
prompts, beam search; see fanout.py) skips prefill: decode serves it alone,
marked ``x-pdfleet-fallback: decode-only``.

Embedding (helper D, tests)::

    app = build_app(RouterConfig(prefill=("http://127.0.0.1:8100",), decode=("http://127.0.0.1:8200",)))
    runner = web.AppRunner(app, handler_cancellation=True)  # a disconnecting client cancels both legs

or simply ``runner, port = await start_router(config, "127.0.0.1", 0)``.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec
import yarl
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pdfleet.connector.router.abandon import Abandoned, one_token_body, release_body
from pdfleet.contract.kv_params import remote_decode_request
from pdfleet.contract.router_config import RouterConfig
from pdfleet.contract.routing import FALLBACK_DECODE_ONLY, FALLBACK_HEADER, REVISION_HEADER
from pdfleet.connector.router.endpoints import (
    DECODE,
    PREFILL,
    Endpoint,
    Outstanding,
    RevisionEndpoints,
    Selection,
    lease_allows_reuse,
    pick_least_outstanding,
    select_revision,
)
from pdfleet.connector.router.errors import error_body, error_response
from pdfleet.connector.router.fanout import FAN_OUT, fan_out_reason
from pdfleet.connector.router.flow.gate import FlowGate
from pdfleet.connector.router.metrics import RouterMetrics
from pdfleet.connector.router.request_id import upstream_request_id
from pdfleet.connector.router.outcome import CLIENT_CLOSED, StreamEnd, recorded_status
from pdfleet.connector.router import canary, timing
from pdfleet.connector.router.prefix_routing import PrefixRouting

log = logging.getLogger("pdfleet.router")

REQUEST_ID_HEADER = "X-Request-Id"
STATIC_REVISION = "static"
# 408/429 mean "this endpoint cannot take it now", not "the request is wrong".
_RETRYABLE_4XX = frozenset((408, 429))
_WHOLE_BODY_MAX = 1024 * 1024

_json_decoder = msgspec.json.Decoder()
_json_encode = msgspec.json.Encoder().encode

# A discovery keeps the router's endpoints current until cancelled.
Discovery = Callable[["Router"], Awaitable[None]]

# Set by the relay: the status whose whole answer reached the client / the client left before the end.
_DELIVERED = web.RequestKey("pdfleet_delivered", int)
_CLIENT_LEFT = web.RequestKey("pdfleet_client_left", bool)


class _TooLarge(Exception):
    pass


class _BrokeBeforeFirstByte(Exception):
    """Decode's answer broke while the router still held all of it back."""


@dataclass
class _PrefillResult:
    kv_transfer_params: dict[str, Any] | None = None
    client_error: web.Response | None = None  # a 4xx from prefill, relayed as is


class Router:
    """State of one router: endpoints, load, metrics, the upstream HTTP session."""

    def __init__(self, config: RouterConfig, metrics: RouterMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or RouterMetrics()
        self.outstanding = Outstanding()
        self._groups: dict[str, RevisionEndpoints] = {}
        self.selection = Selection(None, "no endpoints known yet")
        self._ejected: dict[str, float] = {}
        # prometheus children resolved once: labels() costs more than the update itself
        self._in_flight: dict[tuple[str, str], Any] = {}
        self._requests: dict[tuple[str, int], Any] = {}
        self._latency = {leg: self.metrics.leg_latency.labels(leg) for leg in (PREFILL, DECODE, "decode_first_byte")}
        self._tiebreak = {PREFILL: itertools.count(), DECODE: itertools.count()}
        self._session: aiohttp.ClientSession | None = None
        self.abandoned = Abandoned()
        self.prefix = PrefixRouting(config, self.metrics)  # KV-cache-aware choice (prefixAware legs)
        self.flow = FlowGate(config.flow_control, self.metrics.registry)  # flow control; open when disabled
        self._prefill_timeout = aiohttp.ClientTimeout(
            total=config.prefill_timeout_s, sock_connect=config.connect_timeout_s
        )
        # Decode's first byte and idle gaps are bounded per read (see _decode_leg).
        self._decode_timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s)
        self._models_timeout = aiohttp.ClientTimeout(
            total=config.models_timeout_s, sock_connect=config.connect_timeout_s
        )

    # ---- endpoints -------------------------------------------------------

    def set_endpoints(self, groups: Iterable[RevisionEndpoints]) -> None:
        """Replace every known revision; called by discovery on each change."""
        self._groups = {g.revision: g for g in groups}
        old = self.selection.revision.revision if self.selection.revision else None
        self.selection = select_revision(self._groups.values())
        new = self.selection.revision
        if (new.revision if new else None) != old:
            log.info("serving revision %s (%s)", new.revision if new else None, self.selection.reason)
        self._forget_gone_endpoints()
        self.prefix.set_endpoints(self._groups.values())
        self.flow.set_ready_decodes(len(new.ready(DECODE)) if new is not None else 0)
        self.metrics.revision.clear()
        self.metrics.endpoints.clear()
        if new is not None:
            self.metrics.revision.labels(new.revision).set(1)
            for role, eps in ((PREFILL, new.prefill), (DECODE, new.decode)):
                ready = sum(e.ready for e in eps)
                self.metrics.endpoints.labels(role, "true").set(ready)
                self.metrics.endpoints.labels(role, "false").set(len(eps) - ready)

    def _forget_gone_endpoints(self) -> None:
        """Drop the in-flight series of endpoints that left every revision (pod IPs churn)."""
        known = {(role, e.url) for g in self._groups.values()
                 for role, eps in ((PREFILL, g.prefill), (DECODE, g.decode)) for e in eps}
        for key in list(self._in_flight):
            if key not in known and not self.outstanding.counts.get(key[1]):
                del self._in_flight[key]
                self.metrics.in_flight.remove(*key)

    @property
    def groups(self) -> dict[str, RevisionEndpoints]:
        return dict(self._groups)

    def _pick(self, role: str, candidates: tuple[str, ...], tried: set[str],
              body: dict[str, Any] | None = None, chat: bool = False) -> str | None:
        now = time.monotonic()
        ejected = [u for u, until in self._ejected.items() if until > now]
        if len(ejected) != len(self._ejected):
            self._ejected = {u: self._ejected[u] for u in ejected}
        if body is not None and self.prefix.enabled(role):
            return self.prefix.pick(role, candidates, body, chat=chat, outstanding=self.outstanding.counts,
                                    exclude=tried, ejected=ejected, tiebreak=next(self._tiebreak[role]))
        return pick_least_outstanding(
            candidates, self.outstanding.counts, exclude=tried, ejected=ejected, tiebreak=next(self._tiebreak[role])
        )

    def _eject(self, url: str) -> None:
        if self.config.eject_s > 0:
            self._ejected[url] = time.monotonic() + self.config.eject_s

    def _acquire(self, role: str, url: str) -> None:
        self.outstanding.acquire(url)
        timing.leg_started(role)
        gauge = self._in_flight.get((role, url))
        if gauge is None:
            gauge = self._in_flight[(role, url)] = self.metrics.in_flight.labels(role, url)
        gauge.inc()

    def _release(self, role: str, url: str) -> None:
        self.outstanding.release(url)
        timing.leg_ended(role)
        self._in_flight[(role, url)].dec()

    # ---- lifecycle -------------------------------------------------------

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self.config.upstream_keepalive_s)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._decode_timeout, auto_decompress=False,
            skip_auto_headers=("User-Agent",),
        )

    async def close(self) -> None:
        await self.abandoned.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Router.open() was not awaited"
        return self._session

    # ---- handlers --------------------------------------------------------

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle_generate(request, "/v1/completions", chat=False)

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle_generate(request, "/v1/chat/completions", chat=True)

    async def _handle_generate(self, request: web.Request, path: str, *, chat: bool) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = await self.flow.guard(request.headers,
                                             functools.partial(self._generate, request, path, chat=chat))
            status = recorded_status(response.status, delivered=_DELIVERED in request,
                                     client_left=request.get(_CLIENT_LEFT, False))
            return response
        except asyncio.CancelledError:
            # The client closed its connection; after the whole answer (e.g. right
            # after `data: [DONE]`, as the openai client does) that is no disconnect.
            status = recorded_status(request.get(_DELIVERED), delivered=_DELIVERED in request, client_left=True)
            if status == CLIENT_CLOSED:
                self.metrics.client_disconnects.inc()
            raise
        finally:
            counter = self._requests.get((path, status))
            if counter is None:
                counter = self._requests[(path, status)] = self.metrics.requests.labels(path, str(status))
            counter.inc()
            timing.finished(status)
            self.metrics.request_latency.labels(path).observe(time.perf_counter() - started)

    async def _generate(self, request: web.Request, path: str, *, chat: bool) -> web.StreamResponse:
        request_id = upstream_request_id(request.headers.get(REQUEST_ID_HEADER))
        reply_headers = {REQUEST_ID_HEADER: request_id}
        try:
            raw = await self._read_body(request)
        except _TooLarge:
            self.metrics.errors.labels("client_too_large").inc()
            return error_response(
                413, f"request body exceeds the router's limit of {self.config.max_body_bytes} bytes",
                headers=reply_headers,
            )
        try:
            body = _json_decoder.decode(raw)
        except msgspec.DecodeError as exc:
            self.metrics.errors.labels("client_invalid_json").inc()
            return error_response(400, f"request body is not valid JSON: {exc}", headers=reply_headers)
        if not isinstance(body, dict):
            self.metrics.errors.labels("client_not_object").inc()
            return error_response(
                400, f"request body must be a JSON object, got {type(body).__name__}", headers=reply_headers
            )
        if body.pop("kv_transfer_params", None) is not None:
            self.metrics.client_kv_params_dropped.inc()

        group = canary.choose(self.selection, body, chat=chat, request_id=request_id)  # both legs on this pair
        if group is None:
            self.metrics.errors.labels("no_endpoints").inc()
            return error_response(503, f"no endpoints to serve: {self.selection.reason}", headers=reply_headers)
        reply_headers[REVISION_HEADER] = group.revision
        timing.begin(self.metrics, group.revision)

        upstream_headers = {REQUEST_ID_HEADER: request_id, "Content-Type": "application/json",
                            "Accept-Encoding": "identity"}
        for name in self.config.forward_headers:
            value = request.headers.get(name)
            if value is not None:
                upstream_headers[name] = value

        if fan_out_reason(body) is not None:  # several engine requests: decode alone (see fanout.py)
            self.metrics.fallbacks.labels(FAN_OUT).inc()
            reply_headers[FALLBACK_HEADER] = FALLBACK_DECODE_ONLY
            return await self._decode_leg(request, group, path, body, upstream_headers, reply_headers, None)
        leg = asyncio.ensure_future(self._prefill_leg(group, path, body, upstream_headers, chat=chat))
        try:
            # Shielded: a client that leaves mid-leg must not orphan a prefill lease (abandon.py).
            prefill = await asyncio.shield(leg)
        except asyncio.CancelledError:
            self.abandoned.hand_back(leg, functools.partial(self._hand_back, group, path, body, upstream_headers,
                                                            chat=chat))
            raise
        if prefill.client_error is not None:
            prefill.client_error.headers.update(reply_headers)
            return prefill.client_error
        if prefill.kv_transfer_params is None:
            self.metrics.fallbacks.labels("prefill_failed").inc()
            reply_headers[FALLBACK_HEADER] = FALLBACK_DECODE_ONLY
        return await self._decode_leg(request, group, path, body, upstream_headers, reply_headers,
                                      prefill.kv_transfer_params)

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise _TooLarge
        chunks = []
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                raise _TooLarge
            chunks.append(chunk)
        return b"".join(chunks)

    # ---- prefill leg -----------------------------------------------------

    @staticmethod
    def prefill_body(body: dict[str, Any], *, chat: bool) -> dict[str, Any]:
        """The prefill leg's body: one token, not streamed, KV kept for a remote decode."""
        return one_token_body(body, remote_decode_request(), chat=chat)

    async def _prefill_leg(self, group: RevisionEndpoints, path: str, body: dict[str, Any],
                           headers: dict[str, str], *, chat: bool) -> _PrefillResult:
        payload = _json_encode(self.prefill_body(body, chat=chat))
        candidates = group.ready(PREFILL)
        tried: set[str] = set()
        for attempt in range(self.config.prefill_attempts):
            url = self._pick(PREFILL, candidates, tried, body, chat)
            if url is None:
                break
            tried.add(url)
            if attempt:
                self.metrics.retries.labels(PREFILL).inc()
            reason = await self._one_prefill(url, path, payload, headers)
            if isinstance(reason, _PrefillResult):
                return reason
            self.metrics.leg_failures.labels(PREFILL, reason).inc()
            self._eject(url)
            log.warning("prefill leg to %s failed (%s), request %s", url, reason, headers[REQUEST_ID_HEADER])
        return _PrefillResult()

    async def _one_prefill(self, url: str, path: str, payload: bytes,
                           headers: dict[str, str]) -> _PrefillResult | str:
        """One prefill attempt: a result, or the reason it failed."""
        started = time.perf_counter()
        self._acquire(PREFILL, url)
        try:
            async with self.session.post(_target(url, path), data=payload, headers=headers,
                                         timeout=self._prefill_timeout) as resp:
                data = await resp.read()
                if resp.status >= 500 or resp.status in _RETRYABLE_4XX:
                    return f"http_{resp.status}"
                if resp.status >= 400:
                    return _PrefillResult(client_error=web.Response(
                        status=resp.status, body=data,
                        content_type=resp.content_type or "application/json"))
        except asyncio.TimeoutError:
            return "timeout"
        except aiohttp.ClientConnectionError:
            return "connect"
        except aiohttp.ClientError:
            return "protocol"
        finally:
            self._release(PREFILL, url)
            self._latency[PREFILL].observe(time.perf_counter() - started)
        try:
            params = _json_decoder.decode(data).get("kv_transfer_params")
        except (msgspec.DecodeError, AttributeError):
            return "invalid_json"
        if not isinstance(params, dict):
            return "no_kv_transfer_params"
        return _PrefillResult(kv_transfer_params=params)

    async def _hand_back(self, group: RevisionEndpoints, path: str, body: dict[str, Any], headers: dict[str, str],
                         kv_params: dict[str, Any], *, chat: bool) -> None:
        """One-token decode leg whose only purpose is to consume (and so release) prefill's blocks."""
        url = self._pick(DECODE, group.ready(DECODE), set())
        if url is None:
            return
        self._acquire(DECODE, url)
        try:
            async with self.session.post(_target(url, path), headers=headers,
                                         data=_json_encode(release_body(body, kv_params, chat=chat)),
                                         timeout=self._prefill_timeout) as resp:
                await resp.read()
        finally:
            self._release(DECODE, url)

    # ---- decode leg ------------------------------------------------------

    async def _decode_leg(self, request: web.Request, group: RevisionEndpoints, path: str,
                          body: dict[str, Any], headers: dict[str, str], reply_headers: dict[str, str],
                          kv_params: dict[str, Any] | None) -> web.StreamResponse:
        candidates = group.ready(DECODE)
        tried: set[str] = set()
        cfg = self.config
        for attempt in range(cfg.decode_attempts):
            url = self._pick(DECODE, candidates, tried, body, path.endswith("chat/completions"))
            if url is None:
                break
            tried.add(url)
            if attempt:
                self.metrics.retries.labels(DECODE).inc()
                if kv_params is not None and not lease_allows_reuse(kv_params, time.time(), cfg.lease_margin_s):
                    kv_params = None
                    self.metrics.fallbacks.labels("lease_expired").inc()
                    reply_headers[FALLBACK_HEADER] = FALLBACK_DECODE_ONLY
            decode_body = dict(body)
            if kv_params is not None:
                decode_body["kv_transfer_params"] = kv_params
            started = time.perf_counter()
            self._acquire(DECODE, url)
            resp = None
            try:
                try:
                    async with asyncio.timeout(cfg.decode_first_byte_timeout_s):
                        resp = await self.session.post(_target(url, path), data=_json_encode(decode_body), headers=headers)
                except asyncio.TimeoutError:
                    reason = "timeout"
                except aiohttp.ClientConnectionError:
                    reason = "connect"
                except aiohttp.ClientError:
                    reason = "protocol"
                else:
                    self._latency["decode_first_byte"].observe(time.perf_counter() - started)
                    timing.first_byte()
                    if resp.status < 500 and resp.status not in _RETRYABLE_4XX:
                        try:
                            return await self._relay(request, resp, reply_headers)
                        except _BrokeBeforeFirstByte:
                            reason = "broken_answer"  # nothing reached the client: another decode may serve
                    else:
                        reason = f"http_{resp.status}"
                self.metrics.leg_failures.labels(DECODE, reason).inc()
                self._eject(url)
                log.warning("decode leg to %s failed (%s), request %s", url, reason, headers[REQUEST_ID_HEADER])
            finally:
                if resp is not None:
                    resp.release()
                self._release(DECODE, url)
                self._latency[DECODE].observe(time.perf_counter() - started)
        self.metrics.errors.labels("decode_failed").inc()
        return error_response(502, f"decode failed on {len(tried)} endpoint(s) of revision {group.revision}",
                              headers=reply_headers)

    async def _relay(self, request: web.Request, resp: aiohttp.ClientResponse,
                     reply_headers: dict[str, str]) -> web.StreamResponse:
        headers = dict(reply_headers)
        for name in ("Content-Type", "Content-Encoding", "Cache-Control"):
            value = resp.headers.get(name)
            if value is not None:
                headers[name] = value
        length = resp.content_length
        if length is not None and length <= _WHOLE_BODY_MAX and not resp.content_type.endswith("event-stream"):
            # A sized, non-streamed answer arrives in one piece anyway: relay it as one write.
            try:
                async with asyncio.timeout(self.config.decode_idle_timeout_s):
                    data = await resp.read()
            except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
                raise _BrokeBeforeFirstByte from exc
            timing.chunk(data)
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
                request[_DELIVERED] = resp.status
        request[_DELIVERED] = resp.status  # decode's whole answer was written
        try:
            await out.write_eof()
        except ConnectionError:
            return self._client_gone(request, resp, out)
        return out

    def _client_gone(self, request: web.Request, resp: aiohttp.ClientResponse,
                     out: web.StreamResponse) -> web.StreamResponse:
        # Dropping the upstream connection makes decode abort the request.
        if _DELIVERED not in request:
            self.metrics.client_disconnects.inc()
            request[_CLIENT_LEFT] = True
        resp.close()
        return out

    async def handle_models(self, request: web.Request) -> web.Response:
        group = self.selection.revision
        if group is None:
            return error_response(503, f"no endpoints to serve: {self.selection.reason}")
        tried: set[str] = set()
        for _ in range(self.config.decode_attempts):
            url = self._pick(DECODE, group.ready(DECODE), tried)
            if url is None:
                break
            tried.add(url)
            try:
                async with self.session.get(url + "/v1/models", timeout=self._models_timeout,
                                            headers=_auth_only(request)) as resp:
                    data = await resp.read()
                    if resp.status < 500:
                        return web.Response(status=resp.status, body=data,
                                            content_type=resp.content_type or "application/json")
            except (asyncio.TimeoutError, aiohttp.ClientError):
                pass
            self._eject(url)
        return error_response(502, "no decode endpoint answered /v1/models")

    async def handle_health(self, request: web.Request) -> web.Response:
        group = self.selection.revision
        body = {
            "status": "ok" if group is not None else "unavailable",
            "revision": group.revision if group else None,
            "reason": self.selection.reason,
            "prefill_ready": len(group.ready(PREFILL)) if group else 0,
            "decode_ready": len(group.ready(DECODE)) if group else 0,
            "revisions": sorted(self._groups),
            "canary": {"revision": self.selection.canary.revision, "weight": self.selection.canary_weight} if self.selection.canary else None,
            "prefix_routing": self.prefix.status(),
        }
        return web.Response(status=200 if group else 503, body=_json_encode(body), content_type="application/json")

    async def handle_metrics(self, request: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(self.metrics.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp


@functools.lru_cache(maxsize=4096)
def _target(base: str, path: str) -> yarl.URL:
    """Parsed once per endpoint and route (aiohttp would parse the string on every request)."""
    return yarl.URL(base + path)


def _auth_only(request: web.Request) -> dict[str, str]:
    value = request.headers.get("Authorization")
    return {"Authorization": value} if value else {}


ROUTER_KEY = web.AppKey("pdfleet_router", Router)


def static_groups(config: RouterConfig) -> list[RevisionEndpoints]:
    """The single revision made of the static --prefill/--decode lists."""
    events = {u.rstrip("/"): e.split(",") for u, e in config.kv_events}

    def endpoint(url: str) -> Endpoint:
        pub = events.get(url.rstrip("/"), [None])
        return Endpoint(url.rstrip("/"), kv_events=pub[0], kv_events_replay=pub[1] if len(pub) > 1 else None)

    return [RevisionEndpoints(
        revision=STATIC_REVISION,
        prefill=tuple(endpoint(u) for u in config.prefill),
        decode=tuple(endpoint(u) for u in config.decode),
    )]


def build_app(config: RouterConfig, *, discovery: Discovery | None = None) -> web.Application:
    """The router's aiohttp application.

    Endpoints: ``discovery`` if given (an async function that keeps calling
    ``router.set_endpoints`` until cancelled), else Kubernetes EndpointSlices
    when ``config.kubernetes_fleet`` is set, else the static lists.
    Run it with ``handler_cancellation=True`` so that a client that goes away
    cancels both legs (``start_router`` does).
    """
    router = Router(config)
    if discovery is None and config.kubernetes_fleet:
        from pdfleet.connector.router.discovery import kubernetes_discovery

        discovery = kubernetes_discovery(config)
    if discovery is None:
        router.set_endpoints(static_groups(config))

    app = web.Application(client_max_size=config.max_body_bytes + 1)
    app[ROUTER_KEY] = router

    async def lifecycle(app: web.Application):
        await router.open()
        await router.prefix.start()
        task = asyncio.create_task(discovery(router)) if discovery is not None else None
        yield
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await router.prefix.stop()
        await router.close()

    app.cleanup_ctx.append(lifecycle)
    app.router.add_post("/v1/completions", router.handle_completions)
    app.router.add_post("/v1/chat/completions", router.handle_chat)
    app.router.add_get("/v1/models", router.handle_models)
    app.router.add_get("/health", router.handle_health)
    app.router.add_get("/metrics", router.handle_metrics)
    app.router.add_route("*", "/{tail:.*}", _unknown_route)  # last: only what nothing else took
    return app


_ROUTES = {"/v1/completions": "POST", "/v1/chat/completions": "POST", "/v1/models": "GET",
           "/health": "GET", "/metrics": "GET"}


async def _unknown_route(request: web.Request) -> web.Response:
    """404/405 in OpenAI's shape rather than aiohttp's plain text."""
    allowed = _ROUTES.get(request.path)
    if allowed is not None:
        return error_response(405, f"{request.method} is not allowed on {request.path}; use {allowed}",
                              headers={"Allow": allowed})
    return error_response(404, f"no route {request.path}; the router serves {', '.join(sorted(_ROUTES))}")


async def start_router(config: RouterConfig, host: str = "127.0.0.1", port: int = 0, *,
                       discovery: Discovery | None = None) -> tuple[web.AppRunner, int]:
    """Start the router on host:port (0 picks a free port); returns the runner and the bound port.

    Stop it with ``await runner.cleanup()``.
    """
    app = build_app(config, discovery=discovery)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, bound


__all__ = ["Router", "RouterConfig", "build_app", "start_router", "static_groups", "ROUTER_KEY",
           "FALLBACK_HEADER", "REVISION_HEADER", "error_body"]
