"""A real Envoy (pdfleet[gateway]) in front of the Endpoint Picker and fake engines (router_fakes)."""

from __future__ import annotations

import asyncio
import secrets
from datetime import datetime, timezone

import aiohttp
import pytest

from router_fakes import FakeEngine  # noqa: E402

from pdfleet.connector.epp import tls  # noqa: E402
from pdfleet.connector.epp.envoy_config import render  # noqa: E402
from pdfleet.connector.epp.envoy_process import Envoy, free_port  # noqa: E402
from pdfleet.connector.epp.server import EndpointPicker  # noqa: E402
from pdfleet.contract.gateway import FAIL_CLOSE  # noqa: E402
from pdfleet.contract.router_config import RouterConfig  # noqa: E402

# As the router's integration tests: tight timeouts, and eject_s=0 keeps choice a function of load.
FAST = dict(connect_timeout_s=1.0, prefill_timeout_s=2.0, decode_first_byte_timeout_s=2.0,
            decode_idle_timeout_s=2.0, eject_s=0.0)


class Gateway:
    """Engines, one EPP and one Envoy; ``url`` is the gateway's."""

    def __init__(self) -> None:
        self.engines: list[FakeEngine] = []
        self.epp: EndpointPicker | None = None
        self.epp_port = 0
        self.envoy: Envoy | None = None
        self.url = ""
        self.session: aiohttp.ClientSession | None = None
        self.config: RouterConfig | None = None
        # the EPP's caller token: Envoy sends it, the EPP requires it (connector/epp/caller_auth.py)
        self.caller_token = secrets.token_hex(32)
        self.discovery = None  # the EPP's discovery when set (else the static endpoints)
        # secure serving (start's secure): the EPP's certificate and key; None: h2c, as pdfleet local serves it
        self.tls_pair: tuple[bytes, bytes] | None = None
        self.health_port: int | None = None  # start's secure also serves grpc.health.v1 alone, in plaintext

    async def engine(self, name: str, role: str, **kw) -> FakeEngine:
        e = FakeEngine(name=name, role=role, **kw)
        await e.start()
        self.engines.append(e)
        return e

    async def start_epp(self, port: int = 0) -> int:
        assert self.config is not None
        self.epp = EndpointPicker(self.config, discovery=self.discovery, caller_token=self.caller_token)
        self.epp_port = await self.epp.start("127.0.0.1", port, tls_pair=self.tls_pair,
                                             health_port=0 if self.tls_pair else None)
        self.health_port = self.epp.health_port_bound
        return self.epp_port

    async def stop_epp(self) -> None:
        if self.epp is not None:
            await self.epp.stop(grace=0)
            self.epp = None

    async def start(self, prefill, decode, *, mode: str = "buffered", failure_mode: str = FAIL_CLOSE,
                    message_timeout_s: float = 30.0, epp: bool = True, epp_port: int = 0, extra_filters=(),
                    envoy: dict | None = None, secure: bool = False, **overrides) -> str:
        """``envoy``: more arguments of envoy_config.render (e.g. keepalive_interval_s); ``secure``: the EPP serves
        TLS (a self-signed certificate, as `pdfleet epp` makes) and Envoy speaks it; ``overrides``: of the
        RouterConfig."""
        if secure:
            self.tls_pair = tls.self_signed(tls.alt_names("127.0.0.1", ""), datetime.now(timezone.utc))
        settings = dict(FAST)
        settings.update(overrides)
        urls = lambda xs: tuple(x if isinstance(x, str) else x.url for x in xs)  # noqa: E731
        self.config = RouterConfig(prefill=urls(prefill), decode=urls(decode), **settings)
        if epp:
            await self.start_epp()
        else:  # no EPP (down), or one run elsewhere on epp_port
            self.epp_port = epp_port or free_port()
        self._envoy_args = dict(mode=mode, decode_only=urls(decode), failure_mode=failure_mode,
                                message_timeout_s=message_timeout_s, extra_filters=extra_filters,
                                **({"epp_tls": True} if secure else {}), **(envoy or {}))
        return await self.start_envoy()

    async def start_envoy(self, **changes) -> str:
        """(Re)start Envoy, with ``changes`` to the arguments of the last start (``caller_token``: another
        token than the EPP's)."""
        args = {"caller_token": self.caller_token, **self._envoy_args, **changes}
        extra_filters = args.pop("extra_filters")
        config = render(args.pop("mode"), listen_port=0, epp_port=self.epp_port, admin_port=0,
                        connect_timeout_s=args.pop("connect_timeout_s", 1.0), **args)
        anchor = "          - name: envoy.filters.http.ext_proc\n"
        for f in extra_filters:  # JSON is YAML: one flow-style list item, before ext_proc
            config = config.replace(anchor, f"          - {f}\n" + anchor)
        self.envoy = Envoy(config)
        await asyncio.to_thread(self.envoy.start)
        self.url = f"http://127.0.0.1:{self.envoy.listener_port()}"
        return self.url

    async def close_envoy(self) -> None:
        if self.envoy is not None:
            await asyncio.to_thread(self.envoy.stop)
            self.envoy = None

    async def close(self) -> None:
        if self.session is not None:
            await self.session.close()
        if self.envoy is not None:
            await asyncio.to_thread(self.envoy.stop)
        await self.stop_epp()
        for e in self.engines:
            await e.stop()


@pytest.fixture
async def gw():
    g = Gateway()
    g.session = aiohttp.ClientSession()
    try:
        yield g
    finally:
        await g.close()
