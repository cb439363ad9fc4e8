"""Prometheus metrics of the operator, in a registry of its own (one per operator run,
so that several operators in one test process do not share counters)."""

from __future__ import annotations

import logging
from typing import Optional

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

logger = logging.getLogger("pdfleet.operator")


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter("pdfleet_reconciles", "Reconciles run, by result",
                                  ["result"], registry=self.registry)
        self.duration = Histogram("pdfleet_reconcile_duration_seconds", "Time of one reconcile",
                                  buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                                  registry=self.registry)
        self.errors = Counter("pdfleet_reconcile_errors", "Reconciles that failed, by reason",
                              ["reason"], registry=self.registry)
        self.writes = Counter("pdfleet_api_writes", "Write requests sent to the API, by verb, resource and code",
                              ["verb", "resource", "code"], registry=self.registry)
        self.children = Gauge("pdfleet_children", "Child objects the plan wants, per fleet",
                              ["namespace", "name"], registry=self.registry)
        self.fleets = Gauge("pdfleet_fleets", "DisaggregatedInference objects known", registry=self.registry)
        self._runner: Optional[web.AppRunner] = None

    def count(self, name: str, labels: Optional[dict[str, str]] = None) -> float:
        """A sample's value (tests and the bench read counters through this)."""
        total = 0.0
        for metric in self.registry.collect():
            for sample in metric.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in (labels or {}).items()):
                    total += sample.value
        return total

    def record_request(self, verb: str, resource: str, status: int) -> None:
        if verb != "get":
            self.writes.labels(verb, resource, str(status)).inc()

    async def serve(self, port: int, host: str = "0.0.0.0") -> int:
        """Serve /metrics on `port` (0: a free port) in the running loop; returns the port."""
        async def handler(_request: web.Request) -> web.Response:
            return web.Response(body=generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application()
        app.router.add_get("/metrics", handler)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port)
        await site.start()
        bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else port  # type: ignore[union-attr]
        logger.info("metrics on %s:%d/metrics", host, bound)
        return int(bound)

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
