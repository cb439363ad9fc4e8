"""Keeping decodes' holds for conversations' next turns alive (issue 40, part 3): the router's I/O edge.

A decode holds a finished turn's blocks under a lease of ``remote_lease_seconds``; between turns the router
keeps every offer it holds (turn_reuse.Offers) alive, so a next turn that comes later than one lease still
finds the blocks. Like a lease release (lease_release.py), a keep-alive is a one-token completion to the
decode that made the offers, whose kv_transfer_params name them as the decode signed them
(``kv_params.keep_alive_request``); the router holds no fleet key, the decode checks its own signature and
that it still has each hold, and extends it by its lease from then. One request per decode at a time, at
most ``max_keep_alive_offers`` offers each, when an offer has used ``KEEP_ALIVE_FRACTION`` of its lease
(turn_reuse.keep_alive_plan). An offer the decode refuses, or whose lease ends first, is dropped from the
table; a decode that does not answer is tried again after ``RETRY_S`` (its offers then lapse by themselves).
A decode that needs the memory still ends its oldest holds first: a kept-alive offer may be refused later.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import msgspec

from pdfleet.connector.serving.lease_release import MAX_IN_FLIGHT, Background
from pdfleet.connector.serving.turn_reuse import Offer, Offers, keep_alive_plan
from pdfleet.connector.serving.prefill_leg import MAX_PREFILL_ANSWER_BYTES, answer_kv_params
from pdfleet.connector.serving.upstream import json_encode, read_bounded, target
from pdfleet.contract.kv_params import KEPT, keep_alive_answer, keep_alive_request

log = logging.getLogger("pdfleet.router")

# KEPT (the contract's verdict): the decode extended the hold
REFUSED = "refused"  # the decode no longer has it (read, released, lapsed, its memory needed) or it is not its own
LAPSED = "lapsed"  # its lease ended before a keep-alive was accepted: dropped, nothing sent
UNSUPPORTED = "unsupported"  # the decode answered without verdicts (an engine without keep-alives)
FAILED = "failed"  # no answer, or an HTTP error
SKIPPED = "skipped"  # too many keep-alives in flight: tried again at the next look
OUTCOMES = (KEPT, REFUSED, LAPSED, UNSUPPORTED, FAILED, SKIPPED)

# The router looks at its table at least this often (offers arrive between looks), at most this often.
MAX_WAIT_S = 1.0
MIN_WAIT_S = 0.02
# A decode that did not answer (or answered without verdicts) is asked again after this long.
RETRY_S = 1.0


def keep_alive_body(model: str | None, offers: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The keep-alive request (a /v1/completions body): a one-token prompt, one token."""
    out: dict[str, Any] = {"prompt": [0], "max_tokens": 1, "stream": False,
                           "kv_transfer_params": keep_alive_request(offers)}
    if model is not None:
        out["model"] = model
    return out


def keep_alive_outcomes(status: int | None, data: bytes | None, count: int) -> list[str]:
    """Per offer, what the decode's answer to a keep-alive of ``count`` offers says (``status`` None: no
    answer; ``data`` None: an answer past the bound)."""
    if status != 200 or data is None:
        return [FAILED] * count
    try:
        params = answer_kv_params(data)
    except msgspec.DecodeError:
        return [FAILED] * count
    answer = keep_alive_answer(params, count)
    return [UNSUPPORTED] * count if answer is None else [KEPT if ok else REFUSED for ok in answer]


class KeepAlives:
    """Keeps the offers of ``offers`` alive in the background (``start`` in the router's loop; ``close``)."""

    def __init__(self, offers: Offers, metrics: Any, session: Callable[[], aiohttp.ClientSession],
                 timeout: aiohttp.ClientTimeout, limit: int = MAX_IN_FLIGHT) -> None:
        self.offers = offers
        self.metrics = metrics
        self._session = session
        self._timeout = timeout
        self._background = Background(limit)
        self._busy: set[str] = set()  # decodes with a keep-alive in flight
        self._retry_at: dict[str, float] = {}  # decodes that did not answer: not before then
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    def wake(self) -> None:
        """A new offer was kept: look again now (its lease may be shorter than ``MAX_WAIT_S``)."""
        self._wake.set()

    def _count(self, outcome: str, n: int = 1) -> None:
        self.metrics.kv_keep_alives.labels(outcome).inc(n)

    def tick(self, now: float) -> float:
        """Send what is due at ``now``; the seconds until the next look."""
        self._retry_at = {u: t for u, t in self._retry_at.items() if t > now}
        plan = keep_alive_plan(self.offers.items(), now=now, busy=self._busy | set(self._retry_at))
        for key, offer in plan.lapsed:
            if self.offers.drop(key, offer):
                self._count(LAPSED)
        for url, batches in plan.batches.items():
            if self._background.start(lambda url=url, batches=batches: self._send(url, batches)):
                self._busy.add(url)
            else:
                self._count(SKIPPED, sum(len(b) for b in batches))
        wait = MAX_WAIT_S if plan.next_due is None else plan.next_due - now
        return min(MAX_WAIT_S, max(MIN_WAIT_S, wait))

    async def _send(self, url: str, batches: list[list[tuple[str, Offer]]]) -> None:
        try:
            for batch in batches:  # one request at a time to one decode
                sent_at = time.monotonic()
                status, data = None, None
                try:
                    async with self._session().post(
                            target(url, "/v1/completions"), data=json_encode(keep_alive_body(
                                batch[0][1].model, [o.params for _, o in batch])),
                            headers={"Content-Type": "application/json"}, timeout=self._timeout) as resp:
                        status, data = resp.status, await read_bounded(resp, MAX_PREFILL_ANSWER_BYTES)
                except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
                    log.info("keeping %d offer(s) alive at %s failed: %r", len(batch), url, exc)
                outcomes = keep_alive_outcomes(status, data, len(batch))
                for (key, offer), outcome in zip(batch, outcomes):
                    if outcome == KEPT:
                        self.offers.kept(key, offer, sent_at)
                    elif outcome == REFUSED:
                        self.offers.drop(key, offer)
                    self._count(outcome)
                if outcomes and outcomes[0] in (FAILED, UNSUPPORTED):
                    self._retry_at[url] = time.monotonic() + RETRY_S
                    break
        finally:
            self._busy.discard(url)
            self._wake.set()

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                wait = self.tick(time.monotonic())
            except Exception:  # never let the loop die: holds would then lapse silently
                log.exception("keeping offers alive failed")
                wait = MAX_WAIT_S
            try:
                await asyncio.wait_for(self._wake.wait(), wait)
            except asyncio.TimeoutError:
                pass

    async def settle(self) -> None:
        """Until the sends started so far are done (tests)."""
        await self._background.settle()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        await self._background.close()
