"""The router's state: the decision core it shares with other front ends (picker.py), its metrics,
the upstream HTTP session, and the background work a request can leave behind (releases, hand-backs)."""

from __future__ import annotations

import logging
import os
from collections.abc import Awaitable, Callable, Iterable

import aiohttp

from pdfleet.connector.serving import engine_auth, keep_alive, lease_release, turn_reuse
from pdfleet.connector.serving.abandon import Abandoned
from pdfleet.connector.serving.endpoints import Endpoint, RevisionEndpoints
from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.connector.serving.picker import Picker
from pdfleet.connector.serving.pipeline import Pipeline
from pdfleet.connector.serving.prefill_leg import PrefillLeg
from pdfleet.contract.router_config import RouterConfig

log = logging.getLogger("pdfleet.router")


STATIC_REVISION = "static"

# A discovery keeps the router's endpoints current until cancelled.
Discovery = Callable[["RouterState"], Awaitable[None]]


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


class RouterState:
    """One router's parts: the picker, its two legs, the lease releaser, metrics, and the upstream
    HTTP session they share (handlers.py answers the routes over them; app.Router is both)."""

    def __init__(self, config: RouterConfig, metrics: RouterMetrics | None = None) -> None:
        self.config = config
        self.metrics = metrics or RouterMetrics()
        self.picker = Picker(config, self.metrics)
        # The picker's state, under the names the router and its tests have always used.
        self.outstanding = self.picker.outstanding
        self.labels = self.picker.labels
        self.prefix = self.picker.prefix
        self.flow = self.picker.flow
        self._session: aiohttp.ClientSession | None = None
        self.abandoned = Abandoned()
        prefill_timeout = aiohttp.ClientTimeout(total=config.prefill_timeout_s, sock_connect=config.connect_timeout_s)
        session = lambda: self.session  # noqa: E731 (opened later, in open())
        self.releases = lease_release.LeaseReleaser(self.metrics, session, prefill_timeout)
        self.prefill = PrefillLeg(config, self.picker, self.metrics, session)
        # spec.kvTransfer.decodeReuse: the last turn's decode offer per conversation (None: off)
        self.offers = turn_reuse.Offers() if config.decode_reuse else None
        # ... each kept alive at the decode that holds it until a turn takes it (keep_alive.py)
        self.keep_alives = None if self.offers is None else keep_alive.KeepAlives(
            self.offers, self.metrics, session, prefill_timeout)
        self.pipeline = Pipeline(self)  # the steps every front end runs, over these parts
        # Decode's first byte and idle gaps are bounded per read (see decode_leg.py).
        self._decode_timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s)
        self._models_timeout = aiohttp.ClientTimeout(
            total=config.models_timeout_s, sock_connect=config.connect_timeout_s
        )

    # ---- endpoints (the picker's) ------------------------------------------

    def set_endpoints(self, groups: Iterable[RevisionEndpoints]) -> None:
        """Replace every known revision; called by discovery on each change."""
        self.picker.set_endpoints(groups)

    @property
    def selection(self):
        return self.picker.selection

    @property
    def groups(self) -> dict[str, RevisionEndpoints]:
        return self.picker.groups

    # ---- lifecycle -------------------------------------------------------

    async def open(self) -> None:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=self.config.upstream_keepalive_s)
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=self._decode_timeout, auto_decompress=False,
            skip_auto_headers=("User-Agent",),
            middlewares=engine_auth.middlewares(os.environ),  # the engines answer only the fleet's token
        )
        if self.keep_alives is not None:
            self.keep_alives.start()

    async def close(self) -> None:
        await self.abandoned.close()
        await self.releases.close()
        if self.keep_alives is not None:
            await self.keep_alives.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        assert self._session is not None, "Router.open() was not awaited"
        return self._session
