"""The router's HTTP handlers: a generate request through the serving pipeline, its decode leg
relayed; and /v1/models, /health, /metrics."""

from __future__ import annotations

import asyncio
import functools
import time

import aiohttp
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from pdfleet.connector.serving.endpoints import DECODE, PREFILL
from pdfleet.connector.serving.errors import error_response
from pdfleet.connector.serving.outcome import CLIENT_CLOSED, recorded_status
from pdfleet.connector.serving.pipeline import Served
from pdfleet.connector.serving.request import Refusal, refuse
from pdfleet.connector.serving.upstream import CLIENT_LEFT, DELIVERED, auth_only, json_encode
from pdfleet.contract.kv_params import hold_for_next_turn


class Handlers:
    """Mixin of app.Router: what each route answers, over the serving pipeline (serving/pipeline.py);
    the decode leg, relayed to the client, is the router's own (decode_leg.py)."""

    async def handle_generate(self, request: web.Request, *, path: str) -> web.StreamResponse:
        """/v1/completions and /v1/chat/completions (contract/routing.py: GENERATE_ROUTES)."""
        started = time.perf_counter()
        status, served = 500, None
        try:
            try:
                # The body is read before admission: a client still sending its body holds no slot.
                served = self.pipeline.read(path, request.headers, await self._read_body(request))
                await self.pipeline.admit(served)
                response = await self._serve(request, served)
            except Refusal as refusal:
                response = web.Response(status=refusal.status, body=refusal.body, content_type=refusal.content_type,
                                        headers=refusal.headers)
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
            await self.pipeline.finished(served, path, status, started)

    async def _serve(self, request: web.Request, served: Served) -> web.StreamResponse:
        """An admitted request: the pipeline's steps up to decode, then the router's decode leg."""
        pipeline, req = self.pipeline, served.request
        pipeline.choose(served)
        await pipeline.prefill(served)
        await pipeline.decode_slot(served)
        assert served.group is not None
        kv_params, remember = served.kv_params, None
        key = pipeline.conversation(served) if kv_params is not None and req.body.get("stream") is not True else None
        if key is not None:  # decodeReuse: the decode holds this turn's KV for the next (turn_reuse.py)
            kv_params = hold_for_next_turn(kv_params)
            remember = functools.partial(pipeline.remember_offer, served, key)
        return await self.decode.run(request, served.group, req.path, req.body, req.upstream_headers,
                                     req.reply_headers, kv_params, served.lease, remember=remember)

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.config.max_body_bytes
        too_large = refuse(413, f"request body exceeds the router's limit of {limit} bytes", "client_too_large")
        if request.content_length is not None and request.content_length > limit:
            self.metrics.errors.labels(too_large.reason).inc()
            raise too_large
        chunks = []
        size = 0
        async for chunk in request.content.iter_any():
            size += len(chunk)
            if size > limit:
                self.metrics.errors.labels(too_large.reason).inc()
                raise too_large
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
        status, word = self.picker.waiting.health()  # 200 "waiting" at zero with the waiting room on
        body = {
            "status": word,
            "revision": group.revision if group else None,
            "reason": self.selection.reason,
            "prefill_ready": len(group.ready(PREFILL)) if group else 0,
            "decode_ready": len(group.ready(DECODE)) if group else 0,
            "revisions": sorted(self.groups),
            "canary": ({"revision": self.selection.canary.revision, "weight": self.selection.canary_weight}
                       if self.selection.canary else None),
            "prefix_routing": self.prefix.status(),
        }
        return web.Response(status=status, body=json_encode(body), content_type="application/json")

    async def handle_metrics(self, request: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(self.metrics.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp
