"""The ext_proc v3 messages the EPP sends (protobuf builders, no I/O)."""

from __future__ import annotations

from collections.abc import Mapping

from envoy.config.core.v3.base_pb2 import HeaderValue, HeaderValueOption
from envoy.extensions.filters.http.ext_proc.v3.processing_mode_pb2 import ProcessingMode
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3.http_status_pb2 import HttpStatus
from google.protobuf.struct_pb2 import Struct

from pdfleet.connector.epp.protocol import ECHO
from pdfleet.contract.gateway import DESTINATION_ENDPOINT_HEADER, DESTINATION_METADATA_NAMESPACE

_OVERWRITE = HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD
# What the proxy allows in one streamed body message (GAIE's EPP splits at the same size).
STREAMED_CHUNK = 62_000


def _mutation(set_headers: Mapping[str, str], remove: tuple[str, ...] = ()) -> pb.HeaderMutation:
    return pb.HeaderMutation(
        set_headers=[HeaderValueOption(header=HeaderValue(key=k, raw_value=v.encode()), append_action=_OVERWRITE)
                     for k, v in set_headers.items()],
        remove_headers=list(remove))


def destination_metadata(address: str) -> Struct:
    md = Struct()
    md.update({DESTINATION_METADATA_NAMESPACE: {DESTINATION_ENDPOINT_HEADER: address}})
    return md


def processing_mode(modes: Mapping[str, str]) -> ProcessingMode:
    """A ProcessingMode from its fields' enum names (protocol.mode_override)."""
    return ProcessingMode(**{field: ProcessingMode.DESCRIPTOR.fields_by_name[field].enum_type.values_by_name[name].number
                             for field, name in modes.items()})


def continue_headers(set_headers: Mapping[str, str] | None = None, *, response: bool = False,
                     mode_override: Mapping[str, str] | None = None) -> pb.ProcessingResponse:
    """Headers (request or response) go on, with ``set_headers`` set; ``mode_override`` asks the proxy for
    another processing mode for the rest of this request (honoured only with allow_mode_override)."""
    common = pb.CommonResponse(header_mutation=_mutation(set_headers or {}))
    reply = pb.HeadersResponse(response=common)
    out = pb.ProcessingResponse(response_headers=reply) if response else pb.ProcessingResponse(request_headers=reply)
    if mode_override:
        out.mode_override.CopyFrom(processing_mode(mode_override))
    return out


def route_headers(address: str, set_headers: Mapping[str, str], *, remove: tuple[str, ...] = ()) -> pb.ProcessingResponse:
    """The request's headers go on to ``address`` (header + envoy.lb metadata)."""
    headers = dict(set_headers)
    headers[DESTINATION_ENDPOINT_HEADER] = address
    common = pb.CommonResponse(header_mutation=_mutation(headers, remove), clear_route_cache=True)
    return pb.ProcessingResponse(request_headers=pb.HeadersResponse(response=common),
                                 dynamic_metadata=destination_metadata(address))


def route_buffered_body(address: str, set_headers: Mapping[str, str], body: bytes) -> pb.ProcessingResponse:
    """BUFFERED: the whole body replaced and the request sent to ``address``."""
    headers = dict(set_headers)
    headers[DESTINATION_ENDPOINT_HEADER] = address
    headers["content-length"] = str(len(body))
    common = pb.CommonResponse(header_mutation=_mutation(headers), body_mutation=pb.BodyMutation(body=body),
                               clear_route_cache=True)
    return pb.ProcessingResponse(request_body=pb.BodyResponse(response=common),
                                 dynamic_metadata=destination_metadata(address))


def _streamed(piece: bytes, end_of_stream: bool) -> pb.BodyResponse:
    return pb.BodyResponse(response=pb.CommonResponse(body_mutation=pb.BodyMutation(
        streamed_response=pb.StreamedBodyResponse(body=piece, end_of_stream=end_of_stream))))


def streamed_body(body: bytes) -> list[pb.ProcessingResponse]:
    """FULL_DUPLEX_STREAMED: the new body as streamed body responses, the last one ending the stream."""
    pieces = [body[i:i + STREAMED_CHUNK] for i in range(0, len(body), STREAMED_CHUNK)] or [b""]
    return [pb.ProcessingResponse(request_body=_streamed(piece, i == len(pieces) - 1))
            for i, piece in enumerate(pieces)]


def response_body(reply: str, chunk: bytes, end_of_stream: bool) -> pb.ProcessingResponse:
    """The answer to one response body message (``reply``: protocol.response_body_reply): ECHO carries the
    chunk back unchanged, end_of_stream passed through; ACK is empty."""
    if reply == ECHO:
        return pb.ProcessingResponse(response_body=_streamed(chunk, end_of_stream))
    return pb.ProcessingResponse(response_body=pb.BodyResponse())


def empty_trailers() -> pb.ProcessingResponse:
    return pb.ProcessingResponse(request_trailers=pb.TrailersResponse())


def immediate(status: int, body: bytes, headers: Mapping[str, str] | None = None,
              details: str = "") -> pb.ProcessingResponse:
    """Answer the client now (no upstream): the EPP's 4xx/5xx."""
    return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=HttpStatus(code=status), headers=_mutation(headers or {}), body=body, details=details))
