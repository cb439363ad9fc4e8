"""`pdfleet local`'s warm-up: one P/D request per prefill/decode pair, before the router line.

A fresh fleet's first request on each pair pays for what later ones reuse: the side-channel
handshake, NIXL's peer metadata and UCX endpoints, the peer's prepared descriptor lists, and the
engines' first shapes. On a 2 + 1 fleet on 2 CPUs the first four requests took 680-800 ms against
230-400 ms later (docs/reliability.md). Over two runs of fresh fleets the first workload after the
router line ran at a median of 609 requests/min warmed against 564 cold, a modest gain inside the
machine's fleet-to-fleet noise (issue 17). So `pdfleet local` sends each
pair a short request of its own (prefill with ``do_remote_decode``, then decode with the params it
returned), every pair at once, ``rounds`` times, and announces the router after that.

The plan is pure; ``warm_up`` is its I/O edge (aiohttp, straight to the engines, not through the
router: the router's metrics count only what users sent). It never raises: a pair that fails is
reported, and the fleet is announced anyway (its supervisor and smoke test say what is wrong).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Sequence

import aiohttp

from pdfleet.connector.adapter.metric_names import exported_name
from pdfleet.contract.kv_params import remote_decode_request
from pdfleet.operator.local.smoke import fetch_metrics
from pdfleet.operator.observability import metrics_text

__all__ = ["WarmRequest", "WarmResult", "warmup_plan", "warm_up", "summary_line"]

DEFAULT_ROUNDS = 2
TIMEOUT_S = 60.0  # the whole warm-up: a fleet that cannot serve it is announced anyway
# Several whole KV blocks (96+ words: 3+ of the tiny model's 32-token blocks), unlike any user prompt.
_FILLER = " ".join(f"pdfleet warm-up line {i}." for i in range(24))
PULLS = exported_name("transfers") + "_total"
KV_TRANSFER_PARAMS = "kv_transfer_params"  # vLLM's request and response field


@dataclass(frozen=True)
class WarmRequest:
    prefill: str  # engine URLs
    decode: str
    prompt: str


@dataclass(frozen=True)
class WarmResult:
    pairs: int  # requests sent (pairs x rounds)
    answered: int  # both legs answered 200
    pulled: int  # pulls decode completed meanwhile (its connector's counter)
    seconds: float
    errors: tuple[str, ...] = ()


def warmup_plan(prefills: Sequence[str], decodes: Sequence[str], rounds: int) -> list[list[WarmRequest]]:
    """Per round, one request for every (prefill, decode) pair, each with a prompt of its own (a
    fresh prefill every time, so every round moves KV); no rounds without both roles."""
    if rounds < 0:
        raise ValueError(f"rounds must be >= 0, got {rounds!r}")
    if not prefills or not decodes:
        return []
    return [[WarmRequest(p, d, f"[{r}.{i}.{j}] {_FILLER}") for i, p in enumerate(prefills)
             for j, d in enumerate(decodes)] for r in range(rounds)]


def summary_line(result: WarmResult) -> str:
    """The stderr line that says what the warm-up did (the first three failures named)."""
    failed = f"; {len(result.errors)} failed: {'; '.join(result.errors[:3])}" if result.errors else ""
    return (f"warm-up: {result.answered}/{result.pairs} P/D requests answered, {result.pulled} KV pulls,"
            f" {result.seconds:.1f}s{failed}")


async def _pulls(session: aiohttp.ClientSession, decodes: Sequence[str]) -> float:
    total = 0.0
    for url in decodes:
        text = await fetch_metrics(session, url)
        total += metrics_text.total(metrics_text.lenient_samples(text or "")[0], PULLS)
    return total


async def _pair(session: aiohttp.ClientSession, model: str, req: WarmRequest) -> str:
    """One P/D request on one pair: "" when both legs answered 200, else what went wrong."""
    body: dict[str, Any] = {"model": model, "prompt": req.prompt, "max_tokens": 1, "temperature": 0,
                            KV_TRANSFER_PARAMS: remote_decode_request()}
    try:
        async with session.post(req.prefill + "/v1/completions", json=body) as resp:
            if resp.status != 200:
                return f"{req.prefill}: HTTP {resp.status}"
            params = (await resp.json()).get(KV_TRANSFER_PARAMS)
        if not params:
            return f"{req.prefill}: no {KV_TRANSFER_PARAMS} in its answer"
        async with session.post(req.decode + "/v1/completions",
                                json={**body, "max_tokens": 2, KV_TRANSFER_PARAMS: params}) as resp:
            await resp.read()
            return "" if resp.status == 200 else f"{req.decode}: HTTP {resp.status}"
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as exc:
        return f"{req.prefill} -> {req.decode}: {exc!r}"


async def warm_up(plan: list[list[WarmRequest]], model: str, timeout: float = TIMEOUT_S) -> WarmResult:
    """Send the plan, a round at a time (the pairs of a round at once); never raises."""
    started = time.monotonic()
    decodes = sorted({r.decode for rnd in plan for r in rnd})
    sent, answered, errors = 0, 0, []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session:
        before = await _pulls(session, decodes)
        try:
            async with asyncio.timeout(timeout):
                for rnd in plan:
                    sent += len(rnd)
                    results = await asyncio.gather(*(_pair(session, model, r) for r in rnd))
                    answered += sum(1 for e in results if not e)
                    errors += [e for e in results if e]
        except asyncio.TimeoutError:
            errors.append(f"not done within {timeout:g}s")
        pulled = await _pulls(session, decodes) - before
    return WarmResult(pairs=sent, answered=answered, pulled=int(pulled), seconds=time.monotonic() - started,
                      errors=tuple(errors))
