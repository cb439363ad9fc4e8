"""grpc.health.v1 on the Endpoint Picker's gRPC port (GAIE's Endpoint Picker Protocol, "Health Checking"), and alone
in plaintext on its health port for the kubelet's gRPC probes (tls.listeners; one servicer on both servers).

Liveness ("" and "liveness") is SERVING while the process answers; readiness ("readiness") and the ext_proc
service's name (what a gateway's gRPC health check asks, e.g. GAIE's test Envoy) are SERVING only while a
revision has a ready prefill and a ready decode, as GAIE has them (same criteria as readiness), or while the
waiting room can hold requests for one (issue 41: serving/waiting_room.py ``health``). The
statuses are a pure function of readiness; ``Health`` keeps grpc_health's servicer in step with it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from pdfleet.contract.gateway import EXT_PROC_SERVICE, HEALTH_LIVENESS, HEALTH_READINESS

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
POLL_S = 0.5  # how soon readiness follows the endpoints (discovery changes them at any time)


def statuses(ready: bool) -> dict[str, int]:
    """Each health service name's status."""
    readiness = SERVING if ready else NOT_SERVING
    return {"": SERVING, HEALTH_LIVENESS: SERVING, HEALTH_READINESS: readiness, EXT_PROC_SERVICE: readiness}


class Health:
    def __init__(self, ready: Callable[[], bool]) -> None:
        self.servicer = health.aio.HealthServicer()
        self._ready = ready
        self._now: dict[str, int] = {}

    def add_to(self, server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    async def update(self) -> None:
        for name, status in statuses(self._ready()).items():
            if self._now.get(name) != status:
                self._now[name] = status
                await self.servicer.set(name, status)

    async def follow(self) -> None:
        """Keep the statuses in step with readiness until cancelled."""
        while True:
            await self.update()
            await asyncio.sleep(POLL_S)
