"""A fake engine (router_fakes.FakeEngine) that counts the requests it holds at once: what flow
control's maxInFlightPerDecode bounds at a decode (issue 38), measured where decode sees it."""

from __future__ import annotations

from dataclasses import dataclass

from router_fakes import FakeEngine


@dataclass
class CountingEngine(FakeEngine):
    now: int = 0
    most: int = 0

    async def _generate(self, request):
        self.now += 1
        self.most = max(self.most, self.now)
        try:
            return await super()._generate(request)
        finally:
            self.now -= 1


async def counting(fleet, name: str, role: str, **kw) -> CountingEngine:
    """A counting engine started and owned by ``fleet`` (the router's or the gateway's test fixture)."""
    e = CountingEngine(name=name, role=role, **kw)
    await e.start()
    fleet.engines.append(e)
    return e
