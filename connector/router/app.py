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
kv_transfer_params while their lease (``lease_deadline`` in pdfleet.contract.kv_params,
on the router's monotonic clock from when prefill's answer arrived) has ``lease_margin_s``
left, else decode-only. A 4xx
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

from aiohttp import web

from pdfleet.connector.serving.errors import error_body, error_response
from pdfleet.connector.serving.request import refuse, route_refusal
from pdfleet.connector.router.handlers import Handlers
from pdfleet.connector.serving.router_state import Discovery, RouterState, static_groups
from pdfleet.connector.router.decode_leg import DecodeLeg
from pdfleet.connector.serving.upstream import REQUEST_ID_HEADER
from pdfleet.contract.router_config import RouterConfig
from pdfleet.contract.routing import FALLBACK_HEADER, GENERATE_ROUTES, REVISION_HEADER

class Router(Handlers, RouterState):
    """One router: its parts (serving/router_state.py: the picker, the prefill leg, the lease releaser),
    the decode leg it relays itself (decode_leg.py), and what each route answers (handlers.py)."""

    def __init__(self, config: RouterConfig) -> None:
        super().__init__(config)
        self.decode = DecodeLeg(config, self.picker, self.metrics, lambda: self.session, self.releases)


ROUTER_KEY = web.AppKey("pdfleet_router", Router)


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
        from pdfleet.connector.serving.discovery import kubernetes_discovery

        discovery = kubernetes_discovery(config)
    if discovery is None:
        router.set_endpoints(static_groups(config))

    app = web.Application(client_max_size=config.max_body_bytes + 1)
    app[ROUTER_KEY] = router

    async def lifecycle(app: web.Application):
        await router.open()
        await router.picker.start()
        task = asyncio.create_task(discovery(router)) if discovery is not None else None
        yield
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await router.picker.stop()
        await router.close()

    app.cleanup_ctx.append(lifecycle)
    for path in GENERATE_ROUTES:  # the fleet's routes (contract/routing.py), as the Endpoint Picker serves them
        app.router.add_post(path, functools.partial(router.handle_generate, path=path))
    app.router.add_get("/v1/models", router.handle_models)
    app.router.add_get("/health", router.handle_health)
    app.router.add_get("/metrics", router.handle_metrics)
    app.router.add_route("*", "/{tail:.*}", _unknown_route)  # last: only what nothing else took
    return app


_OWN_ROUTES = {"/health": "GET", "/metrics": "GET"}  # the router's own, beside the fleet's routes


async def _unknown_route(request: web.Request) -> web.Response:
    """404/405 in OpenAI's shape rather than aiohttp's plain text, by the rule the Endpoint Picker
    follows too (serving/request.py: route_refusal)."""
    allowed = _OWN_ROUTES.get(request.path)
    if allowed is not None:
        return error_response(405, f"{request.method} is not allowed on {request.path}; use {allowed}",
                              headers={"Allow": allowed})
    refusal = route_refusal(request.method, request.path)
    if refusal is None:  # cannot happen: served routes are registered above
        refusal = refuse(500, f"{request.method} {request.path} has no handler", "no_handler")
    return web.Response(status=refusal.status, body=refusal.body, content_type=refusal.content_type,
                        headers=refusal.headers)


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


__all__ = ["Router", "RouterConfig", "Discovery", "build_app", "start_router", "static_groups", "ROUTER_KEY", "REQUEST_ID_HEADER",
           "FALLBACK_HEADER", "REVISION_HEADER", "error_body"]
