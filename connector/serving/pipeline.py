"""The serving pipeline: one request's steps, in order, for every front end.

    read -> admit (the waiting room at zero, the flow gate) -> choose (the revision pair, the P/D decision)
         -> prefill leg -> decode slot (flow control's bound) -> decode pick -> [the front end's decode leg]
         -> finished (timing and the per-revision series; the hold on the gate given back)

The router's HTTP handlers (router/handlers.py) and the gateway's Endpoint Picker (epp/exchange.py)
call these steps and only translate their protocol to and from them: the decode leg is the one step
that differs (the router relays decode's answer itself; the gateway's proxy does, and the Endpoint
Picker watches it go by). So a request is parsed, admitted, paired, decided, counted and timed the
same whichever front end served it (docs/router.md, docs/gateway.md).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any

import msgspec

from pdfleet.connector.serving import canary, lease_release, timing, turn_reuse
from pdfleet.connector.serving.disaggregation import Decision
from pdfleet.connector.serving.endpoints import DECODE, RevisionEndpoints
from pdfleet.connector.serving.errors import error_body
from pdfleet.connector.serving.fanout import FAN_OUT
from pdfleet.connector.serving.flow.gate import Shed
from pdfleet.connector.serving.flow.hold import Admission
from pdfleet.connector.serving.lease_release import Lease
from pdfleet.connector.serving.prefill_leg import answer_kv_params
from pdfleet.connector.serving.request import Refusal, ServingRequest, read_request, refuse
from pdfleet.connector.serving.waiting import Dropped
from pdfleet.contract.kv_params import reuse_request
from pdfleet.contract.routing import DISAGGREGATION_HEADER, FALLBACK_DECODE_ONLY, FALLBACK_HEADER, REVISION_HEADER
from pdfleet.contract.scale_to_zero import DROPPED_REASON_HEADER

if TYPE_CHECKING:
    from pdfleet.connector.serving.router_state import RouterState


class Served:
    """What the pipeline decided for one request, for the front end's decode leg."""

    __slots__ = ("request", "group", "decodes", "decision", "kv_params", "lease", "hold", "started", "size")

    def __init__(self, request: ServingRequest, started: float, size: int = 0) -> None:
        self.request = request
        self.started = started
        self.size = size  # the body's bytes (the waiting room bounds what it holds by them)
        self.group: RevisionEndpoints | None = None
        self.decodes: tuple[str, ...] = ()  # the decode candidates (the gateway may narrow them)
        self.decision: Decision | None = None
        self.kv_params: dict[str, Any] | None = None  # prefill's, for decode
        self.lease: Lease | None = None  # prefill's blocks, until a decode takes them
        self.hold: Admission | None = None  # the request's place in the flow gate


class Pipeline:
    def __init__(self, state: RouterState) -> None:
        self.state = state
        self.config = state.config
        self.metrics = state.metrics
        self.picker = state.picker
        self._requests: dict[tuple[str, int], Any] = {}  # prometheus children resolved once

    # ---- the steps ---------------------------------------------------------------

    def read(self, path: str, headers: Mapping[str, str], raw: bytes) -> Served:
        """Step 1: the request parsed once (request.py); its timing starts. Raises Refusal."""
        started = time.perf_counter()
        timing.begin(self.metrics)
        try:
            req = read_request(path, headers, raw, forward_headers=self.config.forward_headers)
        except Refusal as refusal:
            self.metrics.errors.labels(refusal.reason).inc()
            raise
        if req.dropped_kv_params:
            self.metrics.client_kv_params_dropped.inc()
        return Served(req, started, len(raw))

    async def admit(self, served: Served) -> None:
        """Step 2: while no pair is ready, the waiting room (waiting.py: held until one is, when it is on);
        then a place in the flow gate (held until ``finished``). Raises Refusal: 429 when shed; 503 or 429
        with the dropped-reason header when the waiting room is full or its wait ran out."""
        req = served.request
        try:
            await self.picker.waiting.hold(req.headers, served.size)
        except Dropped as dropped:
            raise _dropped(dropped, req) from None
        served.hold = Admission(self.picker.flow)
        try:
            await served.hold.enter(req.headers, req.cost)
        except Shed as shed:
            served.hold = None
            raise _shed(shed, req) from None

    def choose(self, served: Served, within: Callable[[tuple[str, ...]], tuple[str, ...]] | None = None) -> None:
        """Step 3: the revision pair (both legs on it) and remote prefill or decode alone. ``within``
        narrows the decode candidates (the gateway's subset hint). Raises Refusal (503)."""
        req, started = served.request, time.perf_counter()
        group = self.picker.choose_pair(req.body, chat=req.chat, request_id=req.request_id, headers=req.headers)
        if group is None:
            self.metrics.errors.labels("no_endpoints").inc()
            raise refuse(503, f"no endpoints to serve: {self.picker.selection.reason}", "no_endpoints",
                         req.reply_headers)
        decodes = group.ready(DECODE)
        if within is not None:
            decodes = within(decodes)
            if not decodes:
                self.metrics.errors.labels("no_endpoints").inc()
                raise refuse(503, f"no ready decode endpoint of revision {group.revision} is in the gateway's "
                                  f"subset", "empty_subset", req.reply_headers)
        served.group, served.decodes = group, decodes
        req.reply_headers[REVISION_HEADER] = group.revision
        timing.serving(group.revision)
        decision = served.decision = self.picker.decide(group, req.body, chat=req.chat, decodes=decodes)
        req.reply_headers[DISAGGREGATION_HEADER] = decision.header()
        if decision.reason == FAN_OUT:  # several engine requests: P/D cannot serve it (see fanout.py)
            self.metrics.fallbacks.labels(FAN_OUT).inc()
            req.reply_headers[FALLBACK_HEADER] = FALLBACK_DECODE_ONLY
        timing.decision_time(time.perf_counter() - started)

    async def prefill(self, served: Served) -> None:
        """Step 4: the prefill leg when the decision is remote; its failure is decode alone (marked).
        Raises Refusal with prefill's own answer when prefill refused the request (a 4xx)."""
        req, group = served.request, served.group
        assert group is not None and served.decision is not None, "choose() first"
        reuse = self._take_offer(served)
        if not served.decision.remote:
            return
        state = self.state
        leg = asyncio.ensure_future(state.prefill.run(group, req.path, req.body, req.upstream_headers, chat=req.chat,
                                                      reuse=reuse))
        try:
            # Shielded: a client that leaves mid-leg must not orphan a prefill lease (abandon.py).
            result = await asyncio.shield(leg)
        except asyncio.CancelledError:
            state.abandoned.hand_back(leg, functools.partial(state.prefill.hand_back, group, req.path, req.body,
                                                             req.upstream_headers, chat=req.chat))
            raise
        if result.client_error is not None:  # a 4xx: the client's mistake, relayed as is
            err = result.client_error
            raise Refusal(err.status, err.body, content_type=err.content_type, reason="prefill_refused",
                          headers=req.reply_headers)
        if result.kv_transfer_params is None:
            self.metrics.fallbacks.labels("prefill_failed").inc()
            timing.kv_fallback()
            req.reply_headers[FALLBACK_HEADER] = FALLBACK_DECODE_ONLY
            return
        served.kv_params = result.kv_transfer_params
        if result.url:
            served.lease = Lease(result.url, result.kv_transfer_params, result.received_at, result.wall_at_receipt)

    # ---- decode's KV reused by the next turn (turn_reuse.py; issue 40) ---------------------------

    def conversation(self, served: Served) -> str | None:
        """The conversation's key when decodeReuse is on and the client names it (the session header,
        ``prompt_cache_key`` or ``user``). Not the first-turn key the canary falls back on: every one-shot
        request looks like a first turn, and its hold, kept alive, would pin decode memory until the
        decode's share ran out; never a request id (an offer under it would never be taken)."""
        if self.state.offers is None:
            return None
        req = served.request
        return canary.explicit_key(req.body, req.headers)

    def _take_offer(self, served: Served) -> dict[str, Any] | None:
        """The last turn's decode offer for the prefill leg's params, or None (an unusable one is released)."""
        key = self.conversation(served)
        offer = self.state.offers.take(key) if key is not None and self.state.offers is not None else None
        if offer is None:
            return None
        assert served.decision is not None
        cfg = self.config
        why = turn_reuse.UNUSED_DECODE_ALONE if not served.decision.remote else turn_reuse.usable(
            offer, now=time.monotonic(), min_tokens=cfg.decode_reuse_min_tokens, block_size=cfg.block_size,
            margin_s=cfg.lease_margin_s)
        if why is not None:
            self._release_offer(offer, served)
            return None
        return reuse_request(offer.params, cfg.decode_reuse_min_tokens)

    def remember_offer(self, served: Served, key: str, url: str, answer: bytes) -> bytes:
        """Decode's whole answer: its offer, if it made one, kept for the conversation's next turn. Returns
        what the client gets: the answer without the offer, whose lease id and signatures are the fleet's
        (a caller could otherwise keep alive or release a hold it was never given)."""
        if self.state.offers is None:
            return answer
        try:
            params = answer_kv_params(answer)
        except msgspec.DecodeError:
            return answer
        offer = turn_reuse.offer_of(params)
        if offer is None:
            return answer
        model = served.request.body.get("model")
        kept = turn_reuse.Offer(url, offer, time.monotonic(), model if isinstance(model, str) else None)
        for old, _why in self.state.offers.remember(key, kept):
            self._release_offer(old, served)
        if self.state.keep_alives is not None:
            self.state.keep_alives.wake()
        body = msgspec.json.decode(answer)  # an object within json_depth's bound: answer_kv_params read it
        body.pop("kv_transfer_params", None)
        return msgspec.json.encode(body)

    def _release_offer(self, offer: turn_reuse.Offer, served: Served) -> None:
        req = served.request
        self.state.releases.release_unread(Lease(offer.url, dict(offer.params), offer.received_at), req.body,
                                           req.upstream_headers, lease_release.REUSE_UNUSED)

    async def decode_slot(self, served: Served) -> None:
        """Step 5: wait for a decode slot under flow control's bound (at once when it is off). A client
        that leaves meanwhile leaves no lease behind; a request shed after maxQueueSeconds neither
        (Refusal, 429)."""
        if served.hold is None:
            return
        try:
            await served.hold.wait_for_decode()
        except asyncio.CancelledError:
            self.release_lease(served, lease_release.CLIENT_GONE)
            raise
        except Shed as shed:
            self.release_lease(served, lease_release.DECODE_REFUSED)  # refused before a decode ran it
            raise _shed(shed, served.request) from None

    def release_lease(self, served: Served, reason: str) -> None:
        """Prefill's blocks go back: no decode will read them (at most once per request)."""
        if served.lease is not None and served.lease.params:
            req = served.request
            self.state.releases.release_unread(served.lease, req.body, req.upstream_headers, reason)

    def pick_decode(self, served: Served, tried: Collection[str] = ()) -> str | None:
        """Step 6: the decode that takes the leg (the role's picking chain)."""
        req = served.request
        return self.picker.pick(DECODE, served.decodes, tried, req.body, req.chat)

    def decode_body(self, served: Served) -> dict[str, Any]:
        """What decode receives: the client's request, plus prefill's params when prefill succeeded."""
        body = dict(served.request.body)
        if served.kv_params is not None:
            body["kv_transfer_params"] = dict(served.kv_params)
        return body

    async def finished(self, served: Served | None, path: str, status: int, started: float) -> None:
        """Last step, however the request ended: counted under ``status`` against its path and revision,
        and its place in the flow gate given back."""
        counter = self._requests.get((path, status))
        if counter is None:
            counter = self._requests[(path, status)] = self.metrics.requests.labels(path, str(status))
        counter.inc()
        timing.finished(status)
        self.metrics.request_latency.labels(path).observe(time.perf_counter() - started)
        if served is not None and served.hold is not None:
            hold, served.hold = served.hold, None
            await hold.leave()


def _shed(shed: Shed, req: ServingRequest) -> Refusal:
    """The flow gate's refusal as the front ends answer it: 429 with Retry-After."""
    return Refusal(shed.status, error_body(shed.status, shed.message), reason="shed",
                   headers={**req.reply_headers, "retry-after": str(shed.retry_after_s)})


def _dropped(dropped: Dropped, req: ServingRequest) -> Refusal:
    """The waiting room's answer: its status, the reason header, Retry-After with a 429."""
    drop = dropped.drop
    message = {503: "no prefill/decode pair is ready to serve (the fleet is scaled to zero or waking)",
               429: "no ready prefill/decode pair took the request in time; the fleet is waking"}[drop.status]
    headers = {**req.reply_headers, DROPPED_REASON_HEADER: drop.reason}
    if drop.retry_after_s is not None:
        headers["retry-after"] = str(drop.retry_after_s)
    return Refusal(drop.status, error_body(drop.status, f"{message}: {drop.reason}"), reason=drop.reason,
                   headers=headers)
