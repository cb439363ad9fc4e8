"""`pdfleet local --gateway`: a real Envoy in front of the local fleet through an Endpoint Picker.

The EPP runs in the caller's event loop (beside `pdfleet local`'s router) with the router's config;
Envoy runs as a child process on the BUFFERED config (FailClose: an EPP failure shows as a 5xx).
"""

from __future__ import annotations

import asyncio
import dataclasses

from pdfleet.connector.epp.envoy_config import BUFFERED, message_timeout_for, render
from pdfleet.connector.epp.envoy_process import Envoy
from pdfleet.connector.epp.server import EndpointPicker
from pdfleet.contract.gateway import FAIL_CLOSE
from pdfleet.contract.router_config import RouterConfig


class LocalGateway:
    def __init__(self, config: RouterConfig, *, mode: str = BUFFERED, failure_mode: str = FAIL_CLOSE,
                 port: int = 0) -> None:
        self.config = dataclasses.replace(config, host="127.0.0.1")
        self.mode, self.failure_mode, self.port = mode, failure_mode, port
        self.epp = EndpointPicker(self.config)
        self.envoy: Envoy | None = None
        self.url = ""

    async def start(self) -> str:
        epp_port = await self.epp.start("127.0.0.1", 0)
        cfg = self.config
        timeout = message_timeout_for(cfg.prefill_timeout_s, cfg.prefill_attempts,
                                      cfg.flow_control.max_queue_s if cfg.flow_control.enabled else 0.0)
        self.envoy = Envoy(render(self.mode, listen_port=self.port, epp_port=epp_port, admin_port=0,
                                  decode_only=cfg.decode, failure_mode=self.failure_mode,
                                  message_timeout_s=timeout, connect_timeout_s=cfg.connect_timeout_s))
        await asyncio.to_thread(self.envoy.start)
        self.url = f"http://127.0.0.1:{self.envoy.listener_port()}"
        return self.url

    async def stop(self) -> None:
        if self.envoy is not None:
            await asyncio.to_thread(self.envoy.stop)
            self.envoy = None
        await self.epp.stop(grace=1.0)
