"""Prometheus metrics of the operator, in a registry of its own (one per operator run,
so that several operators in one test process do not share counters)."""

from __future__ import annotations

import logging
from typing import Any, Mapping, Optional

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from pdfleet.operator.reconcile_plan.fleet_metrics import fleet_series

logger = logging.getLogger("pdfleet.operator")


class OperatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.reconciles = Counter("pdfleet_operator_reconciles", "Reconciles run, by result", ["result"], registry=r)
        self.duration = Histogram("pdfleet_operator_reconcile_duration_seconds", "Time of one reconcile",
                                  buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
                                  registry=r)
        self.errors = Counter("pdfleet_operator_reconcile_errors", "Reconciles that failed, by exception class",
                              ["reason"], registry=r)
        self.writes = Counter("pdfleet_operator_api_writes",
                              "Write requests sent to the API, by verb, resource and code",
                              ["verb", "resource", "code"], registry=r)
        self.children = Gauge("pdfleet_operator_children", "Child objects the plan wants, per fleet",
                              ["namespace", "fleet"], registry=r)
        self.fleets = Gauge("pdfleet_operator_fleets", "DisaggregatedInference objects known", registry=r)
        self.fleet_replicas = Gauge(
            "pdfleet_operator_fleet_replicas",
            "Replicas per fleet, role and state (desired from the spec; replicas, ready, updated of the serving "
            "revision from the status)", ["namespace", "fleet", "role", "state"], registry=r)
        self.fleet_condition = Gauge(
            "pdfleet_operator_fleet_condition", "1 where the fleet's condition has this status",
            ["namespace", "fleet", "type", "status"], registry=r)
        self.fleet_revision = Gauge(
            "pdfleet_operator_fleet_revision_info", "1 for the revision that serves a fleet",
            ["namespace", "fleet", "revision"], registry=r)
        self.unowned_ignored = Counter(
            "pdfleet_operator_unowned_objects_ignored",
            "Objects with a fleet's labels that no decision counted because the fleet's workloads do not own "
            "them (each object once)", ["kind"], registry=r)
        self.scraped_rejected = Counter(
            "pdfleet_operator_scraped_values_rejected",
            "Values scraped from router /metrics that were skipped: not finite, negative, or a counter that went "
            "down within a step", ["reason"], registry=r)
        self.pair_activations = Counter(
            "pdfleet_operator_pair_activations", "Scale to zero: times both roles were woken from 0 (0 -> 1 on both "
            "scalers) for a request the front ends held", ["namespace", "fleet"], registry=r)
        self.pair_retirements = Counter(
            "pdfleet_operator_pair_retirements", "Scale to zero: times both roles went to 0 together after "
            "idleSeconds with no request", ["namespace", "fleet"], registry=r)
        self._fleet_labels: dict[tuple[str, str], list[tuple[Gauge, tuple[str, ...]]]] = {}
        self._runner: Optional[web.AppRunner] = None

    def observe_fleet(self, namespace: str, fleet: str, status: Mapping[str, Any], desired: Mapping[str, int]) -> None:
        """Set a fleet's replica, condition and revision gauges from the status just computed."""
        series = fleet_series(status, desired)
        wanted: list[tuple[Gauge, tuple[str, ...], float]] = []
        for (role, state), value in series.replicas.items():
            wanted.append((self.fleet_replicas, (namespace, fleet, role, state), value))
        for type_, ok in series.conditions.items():
            wanted.append((self.fleet_condition, (namespace, fleet, type_, "true"), 1.0 if ok else 0.0))
            wanted.append((self.fleet_condition, (namespace, fleet, type_, "false"), 0.0 if ok else 1.0))
        if series.revision:
            wanted.append((self.fleet_revision, (namespace, fleet, series.revision), 1.0))
        keep = {(id(g), labels) for g, labels, _ in wanted}
        for gauge, labels in self._fleet_labels.get((namespace, fleet), []):
            if (id(gauge), labels) not in keep:
                gauge.remove(*labels)  # e.g. the revision that stopped serving
        for gauge, labels, value in wanted:
            gauge.labels(*labels).set(value)
        self._fleet_labels[(namespace, fleet)] = [(g, labels) for g, labels, _ in wanted]

    def forget_fleet(self, namespace: str, fleet: str) -> None:
        """Drop every series of a deleted fleet."""
        for gauge, labels in self._fleet_labels.pop((namespace, fleet), []):
            gauge.remove(*labels)
        for metric in (self.children, self.pair_activations, self.pair_retirements):
            try:
                metric.remove(namespace, fleet)
            except KeyError:
                pass

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
