"""The fleet's front ends as the operator reads them: every ready router and Endpoint Picker pod's
/metrics (the canary analysis and the SLO planner read the same per-revision series from both, so a
request served through the Gateway counts as one served through the router)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import aiohttp

from pdfleet.contract.gateway import EPP_METRICS
from pdfleet.contract.labels import FRONT_END_ROLES, ROLE_ROUTER
from pdfleet.contract.ports import HTTP_NAME
from pdfleet.operator.kube.observed import ObservedPod
from pdfleet.operator.observability.metrics_text import MetricsError

T = TypeVar("T")
NONE_READY = "no ready router or Endpoint Picker pod"


def metrics_targets(pods: Sequence[ObservedPod], router_port: int) -> list[tuple[str, str]]:
    """(pod name, /metrics URL) of each ready front-end pod (pure). ``pods`` are the fleet's own
    (controller chain), never a pod taken for its labels."""
    out = []
    for p in pods:
        if p.role in FRONT_END_ROLES and p.ready and p.ip and not p.deleting:
            port = dict(p.ports).get(HTTP_NAME, router_port if p.role == ROLE_ROUTER else EPP_METRICS)
            out.append((p.name, f"http://{p.ip}:{port}/metrics"))
    return out


async def scrape(targets: Sequence[tuple[str, str]], fetch: Callable[[str], Awaitable[str]],
                 parse: Callable[[str], T]) -> tuple[dict[str, T], list[str]]:
    """Each target's parsed figures, and why the others could not be read."""

    async def one(name: str, url: str) -> tuple[str, Any]:
        try:
            return name, parse(await fetch(url))
        except (MetricsError, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            return name, f"{name}: {type(exc).__name__} {exc}".strip()

    results = await asyncio.gather(*(one(n, u) for n, u in targets))
    failures = {name for name, r in results if isinstance(r, str)}
    return ({name: r for name, r in results if name not in failures},
            [r for name, r in results if name in failures])
