"""Releasing a prefill's lease that no decode will read (issue 20 row 6).

After prefill answered with kv_transfer_params the router may still give up on decode:
every decode attempt failed or none was ready (``decode_failed``), decode answered 4xx
before its engine ran (``decode_refused``), the lease ran short and the retry goes
decode-only (``lease_expired``), or the client left before decode answered
(``client_gone``). Decode's connector releases what it refuses or aborts, but only for
requests that reached its engine; for the others the prefill would hold the blocks for
the whole lease.

The router holds no fleet key, so it cannot speak the side channel. It sends the params
back over the HTTP it already uses, to the prefill that produced them: a one-token
completion whose kv_transfer_params are the params as signed plus ``RELEASE_KEY``
(pdfleet.contract.kv_params). That prefill's connector checks its own signature and that
the lease is its own, and frees it unless a reader has claimed it, so a decode that may
be reading is never cut off. Cost: one one-token prefill step, against blocks held for a
whole lease.

Pure: the body and the outcome. I/O edge: ``Background``, bounded fire-and-forget sends, and
``LeaseReleaser``, which sends a release through them (the router's decode leg and the gateway's
Endpoint Picker both release with it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp
import msgspec

from pdfleet.connector.serving.prefill_leg import MAX_PREFILL_ANSWER_BYTES, answer_kv_params
from pdfleet.connector.serving.upstream import REQUEST_ID_HEADER, json_encode, read_bounded, target
from pdfleet.contract.kv_params import release_answer, release_request

log = logging.getLogger("pdfleet.router")

DECODE_FAILED = "decode_failed"
DECODE_REFUSED = "decode_refused"
LEASE_EXPIRED = "lease_expired"
CLIENT_GONE = "client_gone"
# A decode's hold for a conversation's next turn that no prefill will read (turn_reuse.py; issue 40)
REUSE_UNUSED = "reuse_unused"
REASONS = (DECODE_FAILED, DECODE_REFUSED, LEASE_EXPIRED, CLIENT_GONE, REUSE_UNUSED)

ACCEPTED = "accepted"  # the prefill queued the release (it frees the lease unless a reader claimed it)
REFUSED = "refused"  # the prefill refused it, with a reason (not its lease, bad signature, ...)
UNSUPPORTED = "unsupported"  # the prefill answered without a verdict (a connector without releases)
FAILED = "failed"  # no answer, or an HTTP error
SKIPPED = "skipped"  # too many releases in flight: the lease runs its course

MAX_IN_FLIGHT = 64


def release_body(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any]) -> dict[str, Any]:
    """The release request (a /v1/completions body): the client's model, a one-token prompt, one token."""
    out: dict[str, Any] = {"prompt": [0], "max_tokens": 1, "stream": False,
                           "kv_transfer_params": release_request(kv_transfer_params)}
    if "model" in body:
        out["model"] = body["model"]
    return out


def release_outcome(status: int | None, data: bytes | None) -> str:
    """What the prefill's answer to a release request says (``status`` None: no answer; ``data`` None: an
    answer past the bound)."""
    if status is None or status != 200 or data is None:
        return FAILED
    try:
        params = answer_kv_params(data)
    except msgspec.DecodeError:
        return FAILED
    answer = release_answer(params)
    return UNSUPPORTED if answer is None else ACCEPTED if answer else REFUSED


class Background:
    """Fire-and-forget coroutines, at most ``limit`` at once (beyond that they are not started)."""

    def __init__(self, limit: int = MAX_IN_FLIGHT) -> None:
        self.limit = limit
        self._tasks: set[asyncio.Task] = set()

    def start(self, work: Callable[[], Awaitable[None]]) -> bool:
        if len(self._tasks) >= self.limit:
            return False
        task = asyncio.get_running_loop().create_task(work())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def settle(self) -> None:
        """Until the sends started so far are done (tests)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        for t in list(self._tasks):
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


@dataclass
class Lease:
    """A prefill's lease on its way to decode (released at the prefill when no decode will read it)."""

    url: str
    params: dict[str, Any]
    received_at: float | None = None  # monotonic, when the prefill's response arrived
    wall_at_receipt: float | None = None  # the wall clock then (only for params <= 1.2)


class LeaseReleaser:
    """Sends, in the background, the release of a lease no decode will read (at most once per lease)."""

    def __init__(self, metrics: Any, session: Callable[[], aiohttp.ClientSession], timeout: aiohttp.ClientTimeout,
                 limit: int = MAX_IN_FLIGHT) -> None:
        self.metrics = metrics
        self._session = session
        self._timeout = timeout
        self._background = Background(limit)

    def release_unread(self, lease: Lease, body: Mapping[str, Any], headers: Mapping[str, str], reason: str) -> None:
        params, lease.params = lease.params, {}  # once per request
        if not params:
            return
        if not self._background.start(lambda: self._send(lease.url, body, headers, params, reason)):
            self.metrics.kv_releases.labels(reason, SKIPPED).inc()

    async def _send(self, url: str, body: Mapping[str, Any], headers: Mapping[str, str], params: dict[str, Any],
                    reason: str) -> None:
        status, data = None, b""
        try:
            async with self._session().post(target(url, "/v1/completions"), headers=dict(headers),
                                            data=json_encode(release_body(body, params)),
                                            timeout=self._timeout) as resp:
                status, data = resp.status, await read_bounded(resp, MAX_PREFILL_ANSWER_BYTES)
        except (asyncio.TimeoutError, aiohttp.ClientError) as exc:
            log.info("releasing an unread lease at %s failed: %r", url, exc)
        outcome = release_outcome(status, data)
        self.metrics.kv_releases.labels(reason, outcome).inc()
        if outcome != ACCEPTED:
            log.info("lease release (%s) at the prefill: %s, request %s", reason, outcome,
                     headers.get(REQUEST_ID_HEADER))

    async def settle(self) -> None:
        """Until the sends started so far are done (tests)."""
        await self._background.settle()

    async def close(self) -> None:
        await self._background.close()
