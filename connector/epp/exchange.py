"""One request's ext_proc exchange: the proxy's messages in, the EPP's answers out.

The P/D design (docs/gateway.md): once the request's body is whole, the EPP itself runs the prefill
leg (the router's prefill_leg.py, through the shared decision core picker.py), and hands the proxy
the decode body carrying prefill's ``kv_transfer_params`` with the chosen decode of the same
revision pair as the destination. The proxy relays decode's answer to the client chunk by chunk;
the EPP sees only decode's response headers. A prefill lease no decode will read (decode answered
4xx/5xx, or the exchange ended before decode's headers came: the client left, or the proxy gave
up) is released at the prefill as the router does (lease_release.py).

Body modes: BUFFERED (the proxy sends the whole body once; the EPP answers the headers at once and
mutates the body) and FULL_DUPLEX_STREAMED (the proxy streams the body without waiting; the EPP
answers the headers and then the new body once the old one is whole).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf.json_format import MessageToDict

from pdfleet.connector.epp import messages, protocol
from pdfleet.connector.epp.admission import Admission
from pdfleet.connector.serving.lease_release import Lease
from pdfleet.connector.serving.endpoints import DECODE
from pdfleet.connector.serving.errors import error_body
from pdfleet.connector.serving.flow.cost import estimate_cost
from pdfleet.connector.serving.flow.gate import Shed
from pdfleet.connector.serving.fanout import FAN_OUT
from pdfleet.connector.serving.request_id import upstream_request_id
from pdfleet.connector.serving.upstream import REQUEST_ID_HEADER, json_decode, json_encode
from pdfleet.contract.routing import DISAGGREGATION_HEADER, FALLBACK_DECODE_ONLY, FALLBACK_HEADER, REVISION_HEADER

log = logging.getLogger("pdfleet.epp")

Send = Callable[[pb.ProcessingResponse], Awaitable[None]]

# The current request's decision time so far: the picker's picks (the prefill leg's included, which
# runs in a task of its own but shares this mutable cell) add to it (see timed_pick).
_DECISION: contextvars.ContextVar[list[float] | None] = contextvars.ContextVar("pdfleet_epp_decision", default=None)


def timed_pick(pick: Callable[..., Any]) -> Callable[..., Any]:
    """``picker.pick`` that adds its time to the current request's decision time."""

    @functools.wraps(pick)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return pick(*args, **kwargs)
        finally:
            cell = _DECISION.get()
            if cell is not None:
                cell[0] += time.perf_counter() - started

    return timed
_JSON = {"content-type": "application/json"}


class Refused(Exception):
    """The EPP answers the client itself (4xx/5xx), with no upstream."""

    def __init__(self, status: int, body: bytes, headers: dict[str, str] | None = None, reason: str = "") -> None:
        super().__init__(status, reason)
        self.status, self.body, self.headers, self.reason = status, body, headers or {}, reason


def _refuse(status: int, message: str, reason: str, headers: dict[str, str] | None = None) -> Refused:
    return Refused(status, error_body(status, message), {**_JSON, **(headers or {})}, reason)


class Exchange:
    """The state of one request between the proxy and the EPP (one gRPC stream)."""

    def __init__(self, epp: Any, send: Send) -> None:
        self.epp = epp  # server.EndpointPicker: .router (the router's parts: picker, legs, releaser), .metrics
        self.router = epp.router
        self.picker = epp.router.picker
        self.send = send
        self.duplex = False
        self.headers: dict[str, str] = {}
        self.subset: frozenset[str] | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.decided = False
        self.decode_url: str | None = None
        self.lease: Lease | None = None
        self.body: dict[str, Any] = {}
        self.upstream_headers: dict[str, str] = {}
        self.reply_headers: dict[str, str] = {}
        self.admission: Admission | None = None
        self.outcome = "unfinished"
        self.with_body = False
        self.new_body = b""
        self.status: int | None = None
        # The body modes the proxy announced (protocol_config); BUFFERED / none until it does.
        self.request_mode, self.response_mode = protocol.BUFFERED, protocol.NONE
        self.served: str | None = None  # the "ip:port" the gateway says served the request

    # ---- messages from the proxy ---------------------------------------------------

    async def on_message(self, msg: pb.ProcessingRequest) -> None:
        kind = msg.WhichOneof("request")
        if msg.HasField("protocol_config"):
            self._on_protocol(msg.protocol_config)
        metadata = MessageToDict(msg.metadata_context).get("filterMetadata", {}) if msg.HasField("metadata_context") \
            else {}
        if metadata and self.subset is None:
            try:
                self.subset = protocol.subset_hint(metadata)
            except protocol.BadSubset as exc:
                await self._immediate(_refuse(400, str(exc), "bad_subset"))
                return
        if kind == "request_headers":
            hs = msg.request_headers.headers.headers
            self.headers = protocol.header_map((h.key, h.raw_value or h.value) for h in hs)
            if msg.request_headers.end_of_stream:
                await self._decide(b"", with_body=False)
            elif not self.duplex:  # BUFFERED: the body follows (asked for where the proxy allows, see protocol)
                await self.send(messages.continue_headers(
                    mode_override=protocol.mode_override(self.request_mode, self.response_mode)))
        elif kind == "request_body":
            if self.decided:
                return
            if protocol.streamed_too_early(self.request_mode, msg.request_body.end_of_stream):
                await self._immediate(_refuse(
                    500, "the gateway streams request bodies (request_body_mode STREAMED) without letting the "
                         "Endpoint Picker ask for BUFFERED (allow_mode_override): the request went on before a "
                         "decode was chosen", "streamed_request_body"))
                return
            chunk = msg.request_body.body
            self.size += len(chunk)
            if self.size > self.router.config.max_body_bytes:
                await self._immediate(_refuse(
                    413, f"request body exceeds the EPP's limit of {self.router.config.max_body_bytes} bytes",
                    "client_too_large"))
                return
            self.chunks.append(chunk)
            if msg.request_body.end_of_stream:
                await self._decide(b"".join(self.chunks), with_body=True)
        elif kind == "request_trailers":
            if not self.decided:
                await self._decide(b"".join(self.chunks), with_body=True)
            if not self.duplex:
                await self.send(messages.empty_trailers())
        elif kind == "response_headers":
            hs = protocol.header_map((h.key, h.raw_value or h.value) for h in msg.response_headers.headers.headers)
            self.epp.modes.responded(self.request_mode, self.response_mode)
            self.served = protocol.served_endpoint(metadata, hs)
            await self._on_response(int(hs.get(":status", "0") or 0))
            if msg.response_headers.end_of_stream:
                await self._answered()
        elif kind == "response_body":
            # Decode's answer passes through unchanged, as its body mode wants it answered (protocol.
            # response_body_reply); its end is when the request stops holding the decode and its flow slot.
            body = msg.response_body
            await self.send(messages.response_body(protocol.response_body_reply(self.response_mode), body.body,
                                                   body.end_of_stream))
            if body.end_of_stream:
                await self._answered()
        elif kind == "response_trailers":
            await self.send(pb.ProcessingResponse(response_trailers=pb.TrailersResponse()))
            await self._answered()

    # ---- the decision --------------------------------------------------------------

    async def _decide(self, raw: bytes, *, with_body: bool) -> None:
        self.decided = True
        self.with_body = with_body
        path = self.headers.get(":path", "/").split("?", 1)[0]
        try:
            if path in protocol.GENERATE_PATHS:
                await self._decide_generate(path, raw, chat=protocol.GENERATE_PATHS[path])
            else:
                self._decide_other(raw)
        except Refused as refused:
            await self._immediate(refused)
            return
        await self._route()

    def _decide_other(self, raw: bytes) -> None:
        """Any other route (/v1/models, ...): a ready decode of the serving revision, unchanged."""
        started = time.perf_counter()
        group = self.picker.selection.revision
        if group is None:
            raise _refuse(503, f"no endpoints to serve: {self.picker.selection.reason}", "no_endpoints")
        url = self.picker.pick(DECODE, self._decodes(group), ())
        self.epp.metrics.decision.observe(time.perf_counter() - started)
        if url is None:
            raise _refuse(503, "no ready decode endpoint", "no_endpoints")
        self._take_decode(url)
        self.new_body = raw

    async def _decide_generate(self, path: str, raw: bytes, *, chat: bool) -> None:
        router, metrics = self.router, self.router.metrics
        request_id = upstream_request_id(self.headers.get("x-request-id"))
        self.reply_headers = {REQUEST_ID_HEADER.lower(): request_id}
        try:
            body = json_decode(raw)
        except msgspec.DecodeError as exc:
            metrics.errors.labels("client_invalid_json").inc()
            raise _refuse(400, f"request body is not valid JSON: {exc}", "client_invalid_json",
                          self.reply_headers) from None
        if not isinstance(body, dict):
            metrics.errors.labels("client_not_object").inc()
            raise _refuse(400, f"request body must be a JSON object, got {type(body).__name__}", "client_not_object",
                          self.reply_headers)
        if body.pop("kv_transfer_params", None) is not None:
            metrics.client_kv_params_dropped.inc()
        self.body = body
        self.admission = Admission(self.picker.flow)
        try:
            await self.admission.enter(self.headers, estimate_cost(body, chat=chat))
        except Shed as shed:
            raise Refused(shed.status, error_body(shed.status, shed.message),
                          {**_JSON, "retry-after": str(shed.retry_after_s)}, "shed") from None

        spent = [0.0]  # this request's decision time (see timed_pick)
        _DECISION.set(spent)
        started = time.perf_counter()
        group = self.picker.choose_pair(body, chat=chat, request_id=request_id,
                                        headers=self.headers)  # both legs on this pair
        if group is None:
            metrics.errors.labels("no_endpoints").inc()
            raise _refuse(503, f"no endpoints to serve: {self.picker.selection.reason}", "no_endpoints",
                          self.reply_headers)
        decodes = self._decodes(group)
        if not decodes:
            metrics.errors.labels("no_endpoints").inc()
            raise _refuse(503, f"no ready decode endpoint of revision {group.revision} is in the gateway's subset "
                               f"({len(self.subset or ())} endpoint(s))", "empty_subset", self.reply_headers)
        spent[0] += time.perf_counter() - started
        self.reply_headers[REVISION_HEADER] = group.revision
        self.upstream_headers = {REQUEST_ID_HEADER: request_id, "Content-Type": "application/json",
                                 "Accept-Encoding": "identity"}
        for name in router.config.forward_headers:
            value = self.headers.get(name.lower())
            if value is not None:
                self.upstream_headers[name] = value

        kv_params = None
        started = time.perf_counter()
        decision = self.picker.decide(group, body, chat=chat, decodes=decodes)  # serving/disaggregation.py
        spent[0] += time.perf_counter() - started
        self.reply_headers[DISAGGREGATION_HEADER] = decision.header()
        if decision.reason == FAN_OUT:  # several engine requests: P/D cannot serve it (see fanout.py)
            metrics.fallbacks.labels(FAN_OUT).inc()
            self.reply_headers[FALLBACK_HEADER] = FALLBACK_DECODE_ONLY
        if decision.remote:
            leg = asyncio.ensure_future(router.prefill.run(group, path, body, self.upstream_headers, chat=chat))
            try:
                # Shielded: a client that leaves mid-leg must not orphan a prefill lease (abandon.py).
                prefill = await asyncio.shield(leg)
            except asyncio.CancelledError:
                router.abandoned.hand_back(leg, functools.partial(router.prefill.hand_back, group, path, body,
                                                                  self.upstream_headers, chat=chat))
                raise
            if prefill.client_error is not None:
                err = prefill.client_error
                raise Refused(err.status, err.body, {"content-type": err.content_type, **self.reply_headers},
                              "prefill_refused")
            kv_params = prefill.kv_transfer_params
            if kv_params is None:
                metrics.fallbacks.labels("prefill_failed").inc()
                self.reply_headers[FALLBACK_HEADER] = FALLBACK_DECODE_ONLY
            elif prefill.url:
                self.lease = Lease(prefill.url, kv_params, prefill.received_at, prefill.wall_at_receipt)
        url = self.picker.pick(DECODE, decodes, (), body, chat)
        self.epp.metrics.decision.observe(spent[0])  # choose_pair, decide and every pick (prefill's, decode's)
        if url is None:  # cannot happen with decodes non-empty; kept as a guard
            raise _refuse(503, "no ready decode endpoint", "no_endpoints", self.reply_headers)
        self._take_decode(url)
        self.new_body = json_encode(protocol.decode_body(body, kv_params))

    def _decodes(self, group) -> tuple[str, ...]:
        return protocol.within(group.ready(DECODE), self.subset)

    def _take_decode(self, url: str) -> None:
        self.decode_url = url
        self.picker.acquire(DECODE, url)  # released when the exchange ends (decode's answer is over)
        if self.admission is not None:
            self.admission.decode_started()

    # ---- answers -------------------------------------------------------------------

    async def _route(self) -> None:
        assert self.decode_url is not None
        address = protocol.endpoint_address(self.decode_url)
        set_headers = {}
        if REQUEST_ID_HEADER in self.upstream_headers:
            set_headers["x-request-id"] = self.upstream_headers[REQUEST_ID_HEADER]
        if self.epp.engine_authorization is not None:
            set_headers["authorization"] = self.epp.engine_authorization
        if not self.duplex:
            if self.with_body:
                await self.send(messages.route_buffered_body(address, set_headers, self.new_body))
            else:
                await self.send(messages.route_headers(address, set_headers))
        else:
            await self.send(messages.route_headers(address, set_headers,
                                                   remove=("content-length",) if self.with_body else ()))
            if self.with_body:
                for reply in messages.streamed_body(self.new_body):
                    await self.send(reply)
        self.epp.metrics.routed.inc()
        self.outcome = "routed"

    async def _immediate(self, refused: Refused) -> None:
        self.decided = True
        self.outcome = refused.reason
        self.epp.metrics.refused.labels(refused.reason or str(refused.status)).inc()
        await self.send(messages.immediate(refused.status, refused.body, refused.headers, details=refused.reason))

    def _on_protocol(self, config: pb.ProtocolConfiguration) -> None:
        name = ProcessingMode.BodySendMode.Name
        self.request_mode, self.response_mode = name(config.request_body_mode), name(config.response_body_mode)
        self.duplex = self.request_mode == protocol.FULL_DUPLEX
        self.epp.modes.announced(self.request_mode, self.response_mode)

    async def _on_response(self, status: int) -> None:
        self.status = status
        self._settle_lease(status)
        served = protocol.served_url(self.served, self.decode_url,
                                     (u for g in self.picker.groups.values() for u in g.ready(DECODE)))
        if status >= 500 and served is not None:  # the decode that failed: the gateway's word, else the EPP's
            self.router.metrics.leg_failures.labels(DECODE, f"http_{status}").inc()
            self.picker.eject(served)
        await self.send(messages.continue_headers(self.reply_headers, response=True))

    def _release_lease(self, reason: str) -> None:
        assert self.lease is not None
        self.router.releases.release_unread(self.lease, self.body, self.upstream_headers, reason)

    async def _answered(self) -> None:
        """Decode's whole answer went through the proxy: the decode and the flow slot are free."""
        if self.decode_url is not None:
            self.picker.release(DECODE, self.decode_url)
            self.decode_url = None
        if self.admission is not None:
            admission, self.admission = self.admission, None
            await admission.leave()

    def _settle_lease(self, status: int | None) -> None:
        """Decode's status (None: none came) decides the prefill lease: decode's, or released."""
        if self.lease is None or not self.lease.params:
            return
        # Not routed: no decode got it. Routed: a status was due if the gateway sends response headers.
        expected = self.outcome != "routed" or self.epp.modes.responds(self.request_mode, self.response_mode)
        verdict = protocol.lease_verdict(status, status_expected=expected)
        if verdict in (protocol.TAKEN, protocol.UNOBSERVED):
            if verdict == protocol.UNOBSERVED:
                self.epp.modes.unobserved(self.request_mode, self.response_mode)
            self.lease.params = {}
        else:
            self._release_lease(verdict)

    async def finish(self) -> None:
        """The exchange is over (answered, refused, or the stream broke): give back what it holds."""
        if self.status is None:  # no decode status came: the client or proxy left first, or none was sent
            self._settle_lease(None)
        await self._answered()
