"""A request's place in the flow gate (gate.py ``admit``), held from admission until the request ends
(pipeline.py: ``admit`` ... ``finished``): a gateway request is not one coroutine but a gRPC stream
whose end comes later (decode's answer is relayed by the proxy), so for every front end the gate's
context manager is entered and left by hand, in the task that serves the request."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pdfleet.connector.serving.flow.gate import FlowGate


class Admission:
    def __init__(self, gate: FlowGate) -> None:
        self.gate = gate
        self._cm: Any = None
        self._hold: Any = None

    async def enter(self, headers: Mapping[str, str], cost: float | None) -> None:
        """Once admitted; raises flow.gate.Shed when the gate refuses the request."""
        cm = self.gate.admit(headers, cost=cost)
        self._hold = await cm.__aenter__()
        self._cm = cm

    async def leave(self) -> None:
        """The request is over (answered, failed or abandoned): its slot goes to the next."""
        cm, self._cm, self._hold = self._cm, None, None
        if cm is not None:
            await cm.__aexit__(None, None, None)

    async def wait_for_decode(self) -> None:
        """Until the request may start its decode leg under the gate's decode bound."""
        if self._hold is not None:
            await self.gate.wait_for_decode(self._hold)
