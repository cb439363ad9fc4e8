"""The router's HTTP handlers: a generate request end to end (body, revision, both legs), and
/v1/models, /health, /metrics."""

from __future__ import annotations

import asyncio
import functools
import time
from typing import Any

import aiohttp
import msgspec
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pdfleet.connector.serving import timing
from pdfleet.connector.serving.lease_release import Lease
from pdfleet.connector.serving.endpoints import DECODE, PREFILL
from pdfleet.connector.serving.errors import error_response
from pdfleet.connector.serving.fanout import FAN_OUT
from pdfleet.connector.serving.flow.cost import estimate_cost
from pdfleet.connector.serving.outcome import CLIENT_CLOSED, recorded_status
from pdfleet.connector.serving.request_id import upstream_request_id
from pdfleet.connector.serving.upstream import (
    CLIENT_LEFT,
    DELIVERED,
    REQUEST_ID_HEADER,
    auth_only,
    json_decode,
    json_encode,
)
from pdfleet.contract.routing import DISAGGREGATION_HEADER, FALLBACK_DECODE_ONLY, FALLBACK_HEADER, REVISION_HEADER


class _TooLarge(Exception):
    pass


class Handlers:
    """Mixin of app.Router: what each route answers, over the router's parts (router_state.py)."""

    async def handle_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._handle_generate(request, "/v1/completions", chat=False)

    async def handle_chat(self, request: web.Request) -> web.StreamResponse:
        return await self._handle_generate(request, "/v1/chat/completions", chat=True)

    async def _handle_generate(self, request: web.Request, path: str, *, chat: bool) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = await self._generate(request, path, chat=chat)
            status = recorded_status(response.status, delivered=DELIVERED in request,
                                     client_left=request.get(CLIENT_LEFT, False))
            return response
        except asyncio.CancelledError:
            # The client closed its connection; after the whole answer (e.g. right
            # after `data: [DONE]`, as the openai client does) that is no disconnect.
            status = recorded_status(request.get(DELIVERED), delivered=DELIVERED in request, client_left=True)
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
            body = json_decode(raw)
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
        # The gate sees the body's cost; a client still sending its body holds no slot.
        return await self.flow.guard(request.headers, functools.partial(
            self._serve, request, path, body, request_id, reply_headers, chat=chat), cost=estimate_cost(body, chat=chat))

    async def _serve(self, request: web.Request, path: str, body: dict[str, Any], request_id: str,
                     reply_headers: dict[str, str], *, chat: bool) -> web.StreamResponse:
        """An admitted request: its pair, the disaggregation decision, then its legs."""
        group = self.picker.choose_pair(body, chat=chat, request_id=request_id,
                                        headers=request.headers)  # both legs on this pair
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

        decision = self.picker.decide(group, body, chat=chat)  # on the pair chosen above (disaggregation.py)
        reply_headers[DISAGGREGATION_HEADER] = decision.header()
        if decision.reason == FAN_OUT:  # several engine requests: P/D cannot serve it (see fanout.py)
            self.metrics.fallbacks.labels(FAN_OUT).inc()
            reply_headers[FALLBACK_HEADER] = FALLBACK_DECODE_ONLY
        if not decision.remote:
            return await self.decode.run(request, group, path, body, upstream_headers, reply_headers, None, None)
        leg = asyncio.ensure_future(self.prefill.run(group, path, body, upstream_headers, chat=chat))
        try:
            # Shielded: a client that leaves mid-leg must not orphan a prefill lease (abandon.py).
            prefill = await asyncio.shield(leg)
        except asyncio.CancelledError:
            self.abandoned.hand_back(leg, functools.partial(self.prefill.hand_back, group, path, body, upstream_headers,
                                                            chat=chat))
            raise
        if prefill.client_error is not None:  # a 4xx: the client's mistake, relayed as is
            error = prefill.client_error
            return web.Response(status=error.status, body=error.body, content_type=error.content_type,
                                headers=reply_headers)
        if prefill.kv_transfer_params is None:
            self.metrics.fallbacks.labels("prefill_failed").inc()
            timing.kv_fallback()
            reply_headers[FALLBACK_HEADER] = FALLBACK_DECODE_ONLY
        lease = (Lease(prefill.url, prefill.kv_transfer_params, prefill.received_at, prefill.wall_at_receipt)
                 if prefill.kv_transfer_params and prefill.url else None)
        return await self.decode.run(request, group, path, body, upstream_headers, reply_headers,
                                     prefill.kv_transfer_params, lease)

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

    async def handle_models(self, request: web.Request) -> web.Response:
        group = self.selection.revision
        if group is None:
            return error_response(503, f"no endpoints to serve: {self.selection.reason}")
        tried: set[str] = set()
        for _ in range(self.config.decode_attempts):
            url = self.picker.pick(DECODE, group.ready(DECODE), tried)
            if url is None:
                break
            tried.add(url)
            try:
                async with self.session.get(url + "/v1/models", timeout=self._models_timeout,
                                            headers=auth_only(request)) as resp:
                    data = await resp.read()
                    if resp.status < 500:
                        return web.Response(status=resp.status, body=data,
                                            content_type=resp.content_type or "application/json")
            except (asyncio.TimeoutError, aiohttp.ClientError):
                pass
            self.picker.eject(url)
        return error_response(502, "no decode endpoint answered /v1/models")

    async def handle_health(self, request: web.Request) -> web.Response:
        group = self.selection.revision
        body = {
            "status": "ok" if group is not None else "unavailable",
            "revision": group.revision if group else None,
            "reason": self.selection.reason,
            "prefill_ready": len(group.ready(PREFILL)) if group else 0,
            "decode_ready": len(group.ready(DECODE)) if group else 0,
            "revisions": sorted(self.groups),
            "canary": ({"revision": self.selection.canary.revision, "weight": self.selection.canary_weight}
                       if self.selection.canary else None),
            "prefix_routing": self.prefix.status(),
        }
        return web.Response(status=200 if group else 503, body=json_encode(body), content_type="application/json")

    async def handle_metrics(self, request: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(self.metrics.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp
