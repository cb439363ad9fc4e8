"""One request's ext_proc exchange: the proxy's messages in, the EPP's answers out.

The P/D design (docs/gateway.md): once the request's body is whole, the EPP runs the serving
pipeline's steps up to the decode pick (serving/pipeline.py: the same steps as the router, the
prefill leg included), and hands the proxy the decode body carrying prefill's ``kv_transfer_params``
with the chosen decode of the same revision pair as the destination. The proxy relays decode's answer
to the client; the EPP watches it go by (the pipeline's timing: TTFT, ITL, the per-revision series)
and ends the request when it is over. A prefill lease no decode will read (decode answered 4xx/5xx,
or the exchange ended before decode's headers came: the client left, or the proxy gave up) is
released at the prefill as the router does (lease_release.py). This module translates ext_proc to
and from the pipeline; it decides nothing the router does not.

Body modes: BUFFERED (the proxy sends the whole body once; the EPP answers the headers at once and
mutates the body) and FULL_DUPLEX_STREAMED (the proxy streams the body without waiting; the EPP
answers the headers and then the new body once the old one is whole).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from google.protobuf.json_format import MessageToDict

from pdfleet.connector.epp import messages, protocol
from pdfleet.connector.serving import timing
from pdfleet.connector.serving.endpoints import DECODE
from pdfleet.connector.serving.lease_release import Lease
from pdfleet.connector.serving.outcome import CLIENT_CLOSED
from pdfleet.connector.serving.pipeline import Served
from pdfleet.connector.serving.request import Refusal, refuse, route_refusal
from pdfleet.connector.serving.upstream import REQUEST_ID_HEADER, json_encode
from pdfleet.contract.routing import GENERATE_ROUTES

log = logging.getLogger("pdfleet.epp")

Send = Callable[[pb.ProcessingResponse], Awaitable[None]]

# The proxy's message kinds (ProcessingRequest's oneof) and the Exchange method each goes to.
_HANDLERS = {kind: f"_{kind}" for kind in ("request_headers", "request_body", "request_trailers",
                                            "response_headers", "response_body", "response_trailers")}


class Exchange:
    """The state of one request between the proxy and the EPP (one gRPC stream)."""

    def __init__(self, epp: Any, send: Send) -> None:
        self.epp = epp  # server.EndpointPicker: .router (the router's parts: picker, legs, releaser), .metrics
        self.router = epp.router
        self.picker = epp.router.picker
        self.pipeline = epp.router.pipeline
        self.send = send
        self.duplex = False
        self.headers: dict[str, str] = {}
        self.subset: frozenset[str] | None = None
        self.chunks: list[bytes] = []
        self.size = 0
        self.decided = False
        self.decode_url: str | None = None
        self.lease: Lease | None = None
        self.reply_headers: dict[str, str] = {}
        self.serving: Served | None = None  # a generate request on its way through the pipeline
        self.started = time.perf_counter()
        self.ended = False
        self.outcome = "unfinished"
        self.with_body = False
        self.new_body = b""
        self.status: int | None = None
        self.refused_status: int | None = None
        # The body modes the proxy announced (protocol_config); BUFFERED / none until it does.
        self.request_mode, self.response_mode = protocol.BUFFERED, protocol.NONE
        self.served: str | None = None  # the "ip:port" the gateway says served the request

    # ---- messages from the proxy ---------------------------------------------------

    async def on_message(self, msg: pb.ProcessingRequest) -> None:
        """One message from the proxy: its protocol settings and metadata, then its kind's handler."""
        if msg.HasField("protocol_config"):
            self._on_protocol(msg.protocol_config)
        metadata = MessageToDict(msg.metadata_context).get("filterMetadata", {}) if msg.HasField("metadata_context") \
            else {}
        if metadata and self.subset is None:
            try:
                self.subset = protocol.subset_hint(metadata)
            except protocol.BadSubset as exc:
                await self._immediate(refuse(400, str(exc), "bad_subset"))
                return
        kind = msg.WhichOneof("request")
        if kind in _HANDLERS:
            await getattr(self, _HANDLERS[kind])(getattr(msg, kind), metadata)

    async def _request_headers(self, msg: pb.HttpHeaders, metadata: Mapping[str, Any]) -> None:
        if self.headers:  # one request per stream: a second request's headers decide nothing more
            self.epp.metrics.dropped.labels("repeated_request_headers").inc()
            return
        self.headers = protocol.header_map((h.key, h.raw_value or h.value) for h in msg.headers.headers)
        if msg.end_of_stream:
            await self._decide(b"", with_body=False)
        elif not self.duplex:  # BUFFERED: the body follows (asked for where the proxy allows, see protocol)
            await self.send(messages.continue_headers(
                mode_override=protocol.mode_override(self.request_mode, self.response_mode)))

    async def _request_body(self, msg: pb.HttpBody, metadata: Mapping[str, Any]) -> None:
        if self.decided:
            return
        if protocol.streamed_too_early(self.request_mode, msg.end_of_stream):
            await self._immediate(refuse(
                500, "the gateway streams request bodies (request_body_mode STREAMED) without letting the "
                     "Endpoint Picker ask for BUFFERED (allow_mode_override): the request went on before a "
                     "decode was chosen", "streamed_request_body"))
            return
        self.size += len(msg.body)
        if self.size > self.router.config.max_body_bytes:
            await self._immediate(refuse(
                413, f"request body exceeds the EPP's limit of {self.router.config.max_body_bytes} bytes",
                "client_too_large"))
            return
        self.chunks.append(msg.body)
        if msg.end_of_stream:
            await self._decide(b"".join(self.chunks), with_body=True)

    async def _request_trailers(self, msg: pb.HttpTrailers, metadata: Mapping[str, Any]) -> None:
        if not self.decided:
            await self._decide(b"".join(self.chunks), with_body=True)
        if not self.duplex:
            await self.send(messages.empty_trailers())

    async def _response_headers(self, msg: pb.HttpHeaders, metadata: Mapping[str, Any]) -> None:
        hs = protocol.header_map((h.key, h.raw_value or h.value) for h in msg.headers.headers)
        self.epp.modes.responded(self.request_mode, self.response_mode)
        self.served = protocol.served_endpoint(metadata, hs)
        await self._on_response(int(hs.get(":status", "0") or 0))
        if msg.end_of_stream:
            await self._answered()

    async def _response_body(self, msg: pb.HttpBody, metadata: Mapping[str, Any]) -> None:
        # Decode's answer passes through unchanged, as its body mode wants it answered (protocol.
        # response_body_reply); its end is when the request stops holding the decode and its flow slot.
        timing.chunk(msg.body)  # TTFT and ITL as the router measures them on its own relay
        await self.send(messages.response_body(protocol.response_body_reply(self.response_mode), msg.body,
                                               msg.end_of_stream))
        if msg.end_of_stream:
            await self._answered()

    async def _response_trailers(self, msg: pb.HttpTrailers, metadata: Mapping[str, Any]) -> None:
        await self.send(pb.ProcessingResponse(response_trailers=pb.TrailersResponse()))
        await self._answered()

    # ---- the decision --------------------------------------------------------------

    async def _decide(self, raw: bytes, *, with_body: bool) -> None:
        self.decided = True
        self.with_body = with_body
        path = self.headers.get(":path", "/").split("?", 1)[0]
        try:
            refusal = route_refusal(self.headers.get(":method", "GET"), path)
            if refusal is not None:  # the router's rule for every other route (serving/request.py)
                raise refusal
            if path in GENERATE_ROUTES:
                await self._decide_generate(path, raw)
            else:
                self._decide_passthrough(raw)
        except Refusal as refused:
            await self._immediate(refused)
            return
        await self._route()

    def _decide_passthrough(self, raw: bytes) -> None:
        """A passthrough route (/v1/models): a ready decode of the serving revision, unchanged."""
        group = self.picker.selection.revision
        if group is None:
            raise refuse(503, f"no endpoints to serve: {self.picker.selection.reason}", "no_endpoints")
        url = self.picker.pick(DECODE, self._within(group.ready(DECODE)), ())
        if url is None:
            raise refuse(503, "no ready decode endpoint", "no_endpoints")
        self._take_decode(url)
        self.new_body = raw

    async def _decide_generate(self, path: str, raw: bytes) -> None:
        """The pipeline's steps up to the decode pick (serving/pipeline.py); the proxy runs decode's leg."""
        pipeline = self.pipeline
        self.serving = served = pipeline.read(path, self.headers, raw)
        self.reply_headers = served.request.reply_headers
        await pipeline.admit(served)
        pipeline.choose(served, within=self._within if self.subset is not None else None)
        await pipeline.prefill(served)
        self.lease = served.lease  # from here, the exchange's end releases it unless a decode took it
        await pipeline.decode_slot(served)
        url = pipeline.pick_decode(served)
        current = timing.current()
        if current is not None:  # the pair, the decision and every pick, prefill's and decode's
            self.epp.metrics.decision.observe(current.decision_s)
        if url is None:  # cannot happen with candidates left by choose(); kept as a guard
            raise refuse(503, "no ready decode endpoint", "no_endpoints", self.reply_headers)
        self._take_decode(url)
        self.new_body = json_encode(pipeline.decode_body(served))

    def _within(self, decodes: tuple[str, ...]) -> tuple[str, ...]:
        return protocol.within(decodes, self.subset)

    @property
    def body(self) -> dict[str, Any]:
        return self.serving.request.body if self.serving is not None else {}

    @property
    def upstream_headers(self) -> dict[str, str]:
        return self.serving.request.upstream_headers if self.serving is not None else {}

    def _take_decode(self, url: str) -> None:
        self.decode_url = url
        self.picker.acquire(DECODE, url)  # released when the exchange ends (decode's answer is over)

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

    async def _immediate(self, refused: Refusal) -> None:
        self.decided = True
        self.outcome = refused.reason
        self.refused_status = refused.status
        self.epp.metrics.refused.labels(refused.reason or str(refused.status)).inc()
        await self.send(messages.immediate(refused.status, refused.body,
                                           {"content-type": refused.content_type, **refused.headers},
                                           details=refused.reason))

    def _on_protocol(self, config: pb.ProtocolConfiguration) -> None:
        name = ProcessingMode.BodySendMode.Name
        self.request_mode, self.response_mode = name(config.request_body_mode), name(config.response_body_mode)
        self.duplex = self.request_mode == protocol.FULL_DUPLEX
        self.epp.modes.announced(self.request_mode, self.response_mode)

    async def _on_response(self, status: int) -> None:
        self.status = status
        timing.first_byte()  # decode answered: its leg stops waiting (the pipeline's timing hook)
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
        await self._end()

    async def _end(self) -> None:
        """Once: the request counted (path, status, its revision's series) and its flow slot freed."""
        if self.ended or self.serving is None:
            return
        self.ended = True
        status = self.status if self.status is not None else self.refused_status or CLIENT_CLOSED
        await self.pipeline.finished(self.serving, self.serving.request.path, status, self.started)

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
