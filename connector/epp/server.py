"""The Endpoint Picker as a gRPC (grpc.aio) ext_proc v3 server, and its /metrics and /health.

The decision core and the legs are the router's own (router_state.RouterState: picker.py,
prefill_leg.py, lease_release.py), driven by exchange.py instead of the router's HTTP handlers.

Embedding (tests)::

    epp = EndpointPicker(RouterConfig(prefill=(...), decode=(...)), caller_token=token)
    port = await epp.start("127.0.0.1", 0)
    ...
    await epp.stop()
"""

from __future__ import annotations

import asyncio
import logging
import os

import grpc
from aiohttp import web
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest

from pdfleet.connector.epp import caller_auth
from pdfleet.connector.epp import protocol, tls
from pdfleet.connector.epp.exchange import Exchange
from pdfleet.connector.epp.gateway_modes import GatewayModes
from pdfleet.connector.epp.health import Health
from pdfleet.connector.serving import engine_auth
from pdfleet.connector.serving.router_state import Discovery, static_groups
from pdfleet.connector.serving.endpoints import DECODE, PREFILL
from pdfleet.connector.serving.router_state import RouterState
from pdfleet.connector.serving.upstream import json_encode
from pdfleet.contract.metrics import EPP_DECISION, EPP_DROPPED_MESSAGES
from pdfleet.contract.router_config import RouterConfig

log = logging.getLogger("pdfleet.epp")

# Decision times are well under a millisecond: the buckets say how far under.
_DECISION_BUCKETS = (2.5e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2e-4, 2.5e-4, 3e-4, 3.5e-4, 4e-4, 4.5e-4, 5e-4, 6e-4,
                     7.5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 5e-2)

# The gateway pings its connection to the EPP (envoy_config's connection_keepalive) whether or not a
# request is in flight, and the EPP sends nothing while a prefill leg runs. gRPC's default ping policy
# counts such pings as abuse (more often than every 5 min without data sent, or any while idle) and
# after a few closes the connection (GOAWAY too_many_pings), cutting every request on it: a prefill leg
# longer than about 3 ping intervals would fail. max_ping_strikes 0 bears them (a ping costs one small
# ack; whoever reaches this port can open streams, which cost more).
SERVER_OPTIONS = [("grpc.so_reuseport", 0), ("grpc.http2.max_ping_strikes", 0)]


class EppMetrics:
    def __init__(self, registry) -> None:
        self.decision = Histogram(EPP_DECISION, "EPP time to choose the pair and the endpoints "
                                  "of one request: the pair and every pick, prefill's and decode's, prefix-aware scoring "
                                  "included; the prefill leg's I/O excluded",
                                  buckets=_DECISION_BUCKETS, registry=registry)
        self.routed = Counter("pdfleet_epp_routed", "Requests the EPP sent on to a decode", registry=registry)
        self.refused = Counter("pdfleet_epp_refused", "Requests the EPP answered itself, by reason", ["reason"],
                               registry=registry)
        self.dropped = Counter(EPP_DROPPED_MESSAGES, "ext_proc messages dropped because they are not "
                               "valid at that point of a stream (e.g. a second request's headers: one stream is one "
                               "request), by reason", ["reason"], registry=registry)
        self.streams = Counter("pdfleet_epp_streams", "ext_proc streams, by how they ended (done: the proxy "
                               "closed it; cancelled: the proxy reset it, e.g. its client left)", ["end"],
                               registry=registry)


class EndpointPicker(pb_grpc.ExternalProcessorServicer):
    def __init__(self, config: RouterConfig, *, discovery: Discovery | None = None, caller_token: str | None = None,
                 any_caller: bool = False) -> None:
        """``caller_token``: what every ext_proc caller must send (caller_auth.py); ``any_caller`` serves
        callers without it instead. One of the two is required (caller_auth.CallerTokenError)."""
        self.config = config
        caller_token = caller_auth.caller_token(caller_token, any_caller=any_caller)
        self.router = RouterState(config)  # the router's parts, without its HTTP handlers
        # The decode request is the proxy's: the EPP sets the fleet's engine token on it (replacing a
        # client's Authorization), as the router's session does on its own legs (engine_auth.py).
        token = engine_auth.engine_token(os.environ)
        self.engine_authorization = f"Bearer {token}" if token else None
        self.metrics = EppMetrics(self.router.metrics.registry)
        self.modes = GatewayModes()  # what the gateway's processing mode turned out to be (gateway_modes.py)
        self.health = Health(lambda: self.router.picker.waiting.health()[0] == 200)  # ready at zero with a waiting room
        self._health_task: asyncio.Task | None = None
        self._interceptors = caller_auth.interceptors(caller_token, self.router.metrics.registry)
        self._discovery = discovery
        if discovery is None and config.kubernetes_fleet:
            from pdfleet.connector.serving.discovery import kubernetes_discovery

            self._discovery = kubernetes_discovery(config)
        if self._discovery is None:
            self.router.set_endpoints(static_groups(config))
        self._server: grpc.aio.Server | None = None
        self._health_server: grpc.aio.Server | None = None  # grpc.health.v1 alone, plaintext (start's health_port)
        self.health_port_bound: int | None = None
        self._http: web.AppRunner | None = None
        self.metrics_url: str | None = None  # once serving /metrics (start's metrics_port; 0: a free port)
        self._task: asyncio.Task | None = None

    # ---- the ext_proc stream -----------------------------------------------------------

    async def Process(self, request_iterator, context):  # noqa: N802 (the gRPC method's name)
        exchange = Exchange(self, context.write)
        end = "cancelled"
        try:
            async for message in request_iterator:
                await exchange.on_message(message)
            end = "done"
        finally:
            self.metrics.streams.labels(end).inc()
            await exchange.finish()

    # ---- lifecycle -------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1", port: int = 0, *, metrics_port: int | None = None,
                    tls_pair: tuple[bytes, bytes] | None = None, health_port: int | None = None) -> int:
        """Serve ext_proc on host:port (0: a free port), over TLS with ``tls_pair`` (certificate PEM, key PEM;
        tls.py) else h2c, and grpc.health.v1 alone in plaintext on ``health_port`` (0: a free one; None: none);
        returns the bound ext_proc port (the health port's: ``health_port_bound``)."""
        await self.router.open()
        await self.router.picker.start()
        if self._discovery is not None:
            self._task = asyncio.create_task(self._discovery(self.router))
        main, *health_only = tls.listeners(port, health_port, secure=tls_pair is not None)
        self._server = grpc.aio.server(options=SERVER_OPTIONS, interceptors=self._interceptors)
        pb_grpc.add_ExternalProcessorServicer_to_server(self, self._server)
        self.health.add_to(self._server)
        await self.health.update()
        self._health_task = asyncio.create_task(self.health.follow())
        bound = _bind(self._server, host, main.port, tls.server_credentials(tls_pair) if main.tls else None)
        await self._server.start()
        for listener in health_only:  # its own server: a port of one server would serve ext_proc as well
            self._health_server = grpc.aio.server(options=SERVER_OPTIONS)
            self.health.add_to(self._health_server)
            self.health_port_bound = _bind(self._health_server, host, listener.port, None)
            await self._health_server.start()
        if metrics_port is not None:
            app = web.Application()
            app.router.add_get("/metrics", self._metrics)
            app.router.add_get("/health", self._health)
            self._http = web.AppRunner(app, access_log=None)
            await self._http.setup()
            site = web.TCPSite(self._http, host, metrics_port)
            await site.start()
            bound_http = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.metrics_url = f"http://{'[' + host + ']' if ':' in host else host}:{bound_http}/metrics"
        log.info("endpoint picker serving ext_proc and grpc.health.v1 on %s:%d (%s), grpc.health.v1 alone on %s; the "
                 "gateway's ext_proc filter needs: %s", host, bound, "TLS" if tls_pair else "h2c",
                 self.health_port_bound or "no other port", protocol.GATEWAY_NEEDS)
        return bound

    async def stop(self, grace: float | None = 1.0) -> None:
        if self._health_task is not None:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None
        if self._health_server is not None:
            await self._health_server.stop(0)
            self._health_server = None
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._http is not None:
            await self._http.cleanup()
        await self.router.picker.stop()
        await self.router.releases.settle()
        await self.router.close()

    async def wait(self) -> None:
        assert self._server is not None
        await self._server.wait_for_termination()

    async def _metrics(self, request: web.Request) -> web.Response:
        resp = web.Response(body=generate_latest(self.router.metrics.registry))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def _health(self, request: web.Request) -> web.Response:
        group = self.router.picker.selection.revision
        status, word = self.router.picker.waiting.health()  # 200 "waiting" at zero with the waiting room on
        body = {"status": word, "revision": group.revision if group else None,
                "reason": self.router.picker.selection.reason,
                "prefill_ready": len(group.ready(PREFILL)) if group else 0,
                "decode_ready": len(group.ready(DECODE)) if group else 0,
                "prefix_routing": self.router.picker.prefix.status()}
        return web.Response(status=status, body=json_encode(body), content_type="application/json")


def _bind(server: grpc.aio.Server, host: str, port: int, credentials) -> int:
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"  # a v6 pod IP
    bound = server.add_secure_port(address, credentials) if credentials else server.add_insecure_port(address)
    if bound == 0:
        raise OSError(f"cannot bind the EPP's gRPC port {host}:{port}")
    return bound
