"""The front of a `pdfleet local` fleet: the P/D router in this process, and with --gateway a real
Envoy through the Endpoint Picker in front of it."""

from __future__ import annotations

import asyncio
from typing import Any

from pdfleet.contract.router_config import RouterConfig
from pdfleet.contract import metrics
from pdfleet.operator.local.console import StartupFailed, err

# How long the router line waits for the router's tokenizer (prefix routing) before it is printed anyway.
ROUTER_TOKENIZER_WAIT_S = 120.0


async def start_router(config: RouterConfig, port: int) -> tuple[Any, str]:
    """The router listening on 127.0.0.1:``port`` (0: a free one): (its aiohttp runner, its URL)."""
    from pdfleet.connector.router.app import start_router as start_app

    try:
        runner, bound = await start_app(config, "127.0.0.1", port)
    except OSError as exc:
        raise StartupFailed(f"--router-port {port}: cannot listen: {exc.strerror}") from None
    return runner, f"http://127.0.0.1:{bound}"


async def wait_for_tokenizer(router_runner: Any) -> None:
    """Until the router's tokenizer is loaded, or ``ROUTER_TOKENIZER_WAIT_S`` passed (then said on stderr)."""
    from pdfleet.connector.router.app import ROUTER_KEY

    # The router runs in this process: loading its tokenizer (importing transformers: ~6 s on 2
    # cores) holds the GIL, and every request sent meanwhile waits on it. Announce it once loaded.
    prefix = router_runner.app[ROUTER_KEY].prefix
    try:
        await asyncio.wait_for(prefix.wait_ready(), ROUTER_TOKENIZER_WAIT_S)
    except asyncio.TimeoutError:
        err(f"the router's tokenizer is still loading after {ROUTER_TOKENIZER_WAIT_S:g}s; serving anyway"
            " (prefix routing scores by what the router routed until it is loaded)")
        return
    line = tokenizer_line(prefix.tokenizer_reason)
    if line is not None:  # stderr: stdout carries the router's and the gateway's URL lines only
        err(line)


def tokenizer_line(reason: str | None) -> str | None:
    """What `pdfleet local` says of the router's tokenizer (its metric's reason); None: no leg is prefixAware."""
    if reason is None:
        return None
    if reason == metrics.TOKENIZER_LOADED:
        return "prefix routing: the router hashes prompts with the model's tokenizer"
    return (f"prefix routing: the router has no tokenizer ({reason}): it scores by text chunks, not by the engines' "
            f"blocks (see the router's log; {metrics.ROUTER_TOKENIZER_LOADED} says it too)")


def gateway_for(router_runner: Any) -> Any:
    """A gateway (connector.epp.local_gateway.LocalGateway) over the router's fleet, not started yet."""
    from pdfleet.connector.epp.local_gateway import LocalGateway
    from pdfleet.connector.router.app import ROUTER_KEY

    return LocalGateway(router_runner.app[ROUTER_KEY].config)


async def start_gateway(gateway: Any) -> str:
    """Start it (the caller stops it, started or not); its URL."""
    try:
        return await gateway.start()
    except (OSError, RuntimeError, TimeoutError) as exc:
        raise StartupFailed(f"--gateway: {exc}") from None
