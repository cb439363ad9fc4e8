"""The fleet's PrefixRouting condition from its front ends' tokenizer metric (issue 39 part 3): the reader parses
what the router writes, the condition is a pure function of the readings (table), and the edge reads real
/metrics pages over HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from aiohttp import web
from prometheus_client import generate_latest

from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.contract import metrics as names
from pdfleet.contract.labels import ROLE_EPP, ROLE_ROUTER
from pdfleet.contract.routing import LEAST_OUTSTANDING
from pdfleet.operator.api import parse
from pdfleet.operator.autoscale.planner_edge import _fetch
from pdfleet.operator.kube.observed import ObservedPod
from pdfleet.operator.observability import prefix_routing as pr

ROOT = Path(__file__).resolve().parents[3]
SPEC = parse(yaml.safe_load((ROOT / "examples" / "tiny-cpu.yaml").read_text())).spec
OFF = SPEC.model_copy(update={"router": SPEC.router.model_copy(update={
    "prefill_policy": LEAST_OUTSTANDING, "decode_policy": LEAST_OUTSTANDING})})


def page(reason: str | None) -> str:
    """A front end's /metrics as the router writes it."""
    m = RouterMetrics()
    if reason is not None:
        m.tokenizer_state(reason)
    return generate_latest(m.registry).decode()


@pytest.mark.parametrize("reason", [*names.TOKENIZER_REASONS, None])
def test_the_reader_reads_what_the_router_writes(reason) -> None:
    assert pr.tokenizer_reason(page(reason)) == reason


L, G, N, W = names.TOKENIZER_LOADED, names.TOKENIZER_GATED, names.TOKENIZER_NOT_FOUND, names.TOKENIZER_LOADING
TABLE = [
    ("all loaded", SPEC, {"r-1": L, "epp-1": L}, (), ("True", L)),
    ("one gated", SPEC, {"r-1": L, "epp-1": G}, (), ("False", G)),
    ("first failing named", SPEC, {"a": N, "b": G}, (), ("False", N)),
    ("one loading", SPEC, {"r-1": L, "r-2": W}, (), ("Unknown", W)),
    ("a failure beats loading", SPEC, {"r-1": W, "r-2": G}, (), ("False", G)),
    ("nothing read", SPEC, {}, ("r-1: ClientConnectorError",), ("Unknown", pr.NOT_READ)),
    ("no series", SPEC, {"r-1": None}, (), ("Unknown", pr.NOT_READ)),
    ("no leg prefixAware", OFF, {"r-1": G}, (), None),
]


@pytest.mark.parametrize("case,spec,readings,failures,want", TABLE, ids=[t[0] for t in TABLE])
def test_condition(case, spec, readings, failures, want) -> None:
    got = pr.condition(spec, readings, failures)
    assert (got[:2] if got else None) == want
    if want and want[0] == "False":
        assert all(f"{pod}: {r}" in got[2] for pod, r in readings.items() if r not in (L, W))


def _serve(text: str):
    async def handler(request: web.Request) -> web.Response:
        return web.Response(text=text)

    return handler


async def test_the_edge_reads_each_ready_front_end_over_http() -> None:
    """Two real /metrics pages (a router with its tokenizer, an EPP without): False, Gated, the EPP named."""
    pages = {"/r": page(L), "/e": page(G)}
    servers = []
    for which in ("/r", "/e"):
        one = web.Application()
        one.router.add_get("/metrics", _serve(pages[which]))
        runner = web.AppRunner(one)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        servers.append((runner, runner.addresses[0][1]))
    try:
        pods = [ObservedPod("ml", name, role, "rev", "127.0.0.1", True, False, (("http", port),))
                for (name, role), (_, port) in zip([("tiny-router-1", ROLE_ROUTER), ("tiny-epp-1", ROLE_EPP)],
                                                   servers)]
        got = await pr.read(SPEC, pods, _fetch)
        not_ready = [ObservedPod("ml", "tiny-router-2", ROLE_ROUTER, "rev", "127.0.0.1", False, False)]
        unknown = await pr.read(SPEC, not_ready, _fetch)
    finally:
        for runner, _ in servers:
            await runner.cleanup()
    assert got[:2] == ("False", G), got
    assert "tiny-epp-1: Gated" in got[2] and "tiny-router-1" not in got[2]
    assert unknown[:2] == ("Unknown", pr.NOT_READ)
