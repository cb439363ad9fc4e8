"""The router's state: its endpoints and their load, metrics, the upstream HTTP session."""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Iterable
from typing import Any

import aiohttp

from pdfleet.connector.router import lease_release
from pdfleet.connector.router.abandon import Abandoned
from pdfleet.connector.router.endpoint_labels import EndpointLabels
from pdfleet.connector.router.endpoints import (
    DECODE,
    PREFILL,
    Outstanding,
    RevisionEndpoints,
    Selection,
    pick_least_outstanding,
    select_revision,
)
from pdfleet.connector.router.flow.gate import FlowGate
from pdfleet.connector.router.metrics import RouterMetrics
from pdfleet.connector.router import timing
from pdfleet.connector.router.kvaware.prefix_routing import PrefixRouting
from pdfleet.contract.router_config import RouterConfig

log = logging.getLogger("pdfleet.router")


class RouterState:
    """State of one router: endpoints, load, metrics, the upstream HTTP session (the legs and
    handlers are mixins over it; app.Router puts them together)."""

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
        self.releases = lease_release.Background()
        self.labels = EndpointLabels()  # what endpoints are called in metrics (never their URL: a pod IP)
        self.prefix = PrefixRouting(config, self.metrics, labels=self.labels)  # KV-cache-aware choice
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
        known: dict[str, str] = {}
        for g in self._groups.values():
            for role, eps in ((PREFILL, g.prefill), (DECODE, g.decode)):
                for e in eps:
                    known.setdefault(e.url, role)
        # Series of endpoints that left go first, under their old names (which may then be reused).
        self._forget_gone_endpoints(known)
        self.prefix.set_endpoints(self._groups.values())
        self.labels.update(known, keep=self.outstanding.counts.keys())
        self.flow.set_ready_decodes(len(new.ready(DECODE)) if new is not None else 0)
        self.metrics.revision.clear()
        self.metrics.endpoints.clear()
        if new is not None:
            self.metrics.revision.labels(new.revision).set(1)
            for role, eps in ((PREFILL, new.prefill), (DECODE, new.decode)):
                ready = sum(e.ready for e in eps)
                self.metrics.endpoints.labels(role, "true").set(ready)
                self.metrics.endpoints.labels(role, "false").set(len(eps) - ready)

    def _forget_gone_endpoints(self, known: dict[str, str]) -> None:
        """Drop the in-flight series of endpoints that left every revision (pods churn)."""
        for role, url in list(self._in_flight):
            if url not in known and not self.outstanding.counts.get(url):
                del self._in_flight[(role, url)]
                self.metrics.in_flight.remove(role, self.labels(url))

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
            gauge = self._in_flight[(role, url)] = self.metrics.in_flight.labels(role, self.labels(url))
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
        await self.releases.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Router.open() was not awaited"
        return self._session
