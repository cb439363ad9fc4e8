"""`pdfleet local --gateway`: a real Envoy in front of the local fleet through an Endpoint Picker.

The EPP runs in the caller's event loop (beside `pdfleet local`'s router) with the router's config;
Envoy runs as a child process on the BUFFERED config (FailClose: an EPP failure shows as a 5xx). Each run
draws its own EPP caller token, which Envoy sends and the EPP requires (caller_auth.py).
"""

from __future__ import annotations

import asyncio
import dataclasses
import secrets

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
        # a token per run, on both sides: the EPP's port on loopback serves only this run's Envoy
        self.caller_token = secrets.token_hex(32)
        self.epp = EndpointPicker(self.config, caller_token=self.caller_token)
        self.envoy: Envoy | None = None
        self.url = ""
        self.metrics_url: str | None = None  # the EPP's /metrics: gateway requests' series (pdfleet local prints it)

    async def start(self) -> str:
        epp_port = await self.epp.start("127.0.0.1", 0, metrics_port=0)  # its series: the router's names
        self.metrics_url = self.epp.metrics_url
        cfg = self.config
        timeout = message_timeout_for(cfg.prefill_timeout_s, cfg.prefill_attempts,
                                      cfg.flow_control.max_queue_s if cfg.flow_control.enabled else 0.0,
                                      cfg.scale_to_zero_activation_timeout_s if cfg.scale_to_zero_max_waiting else 0.0)
        self.envoy = Envoy(render(self.mode, listen_port=self.port, epp_port=epp_port, admin_port=0,
                                  caller_token=self.caller_token, decode_only=cfg.decode,
                                  failure_mode=self.failure_mode,
                                  message_timeout_s=timeout, connect_timeout_s=cfg.connect_timeout_s))
        await asyncio.to_thread(self.envoy.start)
        self.url = f"http://127.0.0.1:{self.envoy.listener_port()}"
        return self.url

    async def stop(self) -> None:
        if self.envoy is not None:
            await asyncio.to_thread(self.envoy.stop)
            self.envoy = None
        await self.epp.stop(grace=1.0)
