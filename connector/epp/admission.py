"""A request's place in the flow gate (flow/gate.py), held from admission until its exchange ends.

The gate's ``guard`` runs a handler inside the gate; an EPP request is not one coroutine but a
gRPC stream whose end comes later (decode's answer is relayed by the proxy), so the handler here
only holds the slot until ``leave``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

from aiohttp import web

from pdfleet.connector.router.flow.gate import FlowGate


class Admission:
    def __init__(self, gate: FlowGate) -> None:
        self.gate = gate
        self._done = asyncio.Event()
        self._task: asyncio.Future | None = None

    async def enter(self, headers: Mapping[str, str]) -> web.Response | None:
        """None once admitted; the gate's 429 when it sheds the request."""
        admitted = asyncio.get_running_loop().create_future()

        async def inside() -> web.Response:
            admitted.set_result(None)
            await self._done.wait()
            return _HELD

        self._task = asyncio.ensure_future(self.gate.guard(headers, inside))
        try:
            await asyncio.wait((self._task, admitted), return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self._task.cancel()
            raise
        if admitted.done():
            return None
        response = self._task.result()
        return response if isinstance(response, web.Response) else None

    def leave(self) -> None:
        """The request is over (answered, failed or abandoned): its slot goes to the next."""
        self._done.set()


_HELD = web.Response(status=200)
