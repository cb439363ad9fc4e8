"""A client request as every front end hands it to the pipeline: parsed once (pure).

The front ends (the router's HTTP handlers, the gateway's Endpoint Picker) only translate their
protocol into ``read_request``'s arguments and a ``Refusal`` or the pipeline's answer back into
theirs. Which routes are served, and how, is one table (contract/routing.py: GENERATE_ROUTES,
PASSTHROUGH_ROUTES): any other path is 404 in both front ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from multidict import CIMultiDict, CIMultiDictProxy

from pdfleet.connector.serving.errors import error_body
from pdfleet.connector.serving.flow.cost import estimate_cost
from pdfleet.connector.serving.request_id import upstream_request_id
from pdfleet.connector.serving.upstream import REQUEST_ID_HEADER, json_decode
from pdfleet.contract.routing import GENERATE_ROUTES, PASSTHROUGH_ROUTES

JSON = "application/json"


class Refusal(Exception):
    """The front end answers the client itself: ``status`` with ``body`` (no upstream, or an engine's
    4xx relayed as it is). ``reason`` names it in metrics and logs."""

    def __init__(self, status: int, body: bytes, *, reason: str, content_type: str = JSON,
                 headers: Mapping[str, str] | None = None) -> None:
        super().__init__(status, reason)
        self.status, self.body, self.reason = status, body, reason
        self.content_type = content_type
        self.headers = dict(headers or {})


def refuse(status: int, message: str, reason: str, headers: Mapping[str, str] | None = None) -> Refusal:
    """A refusal in OpenAI's error shape."""
    return Refusal(status, error_body(status, message), reason=reason, headers=headers)


def route_refusal(method: str, path: str) -> Refusal | None:
    """None when the pipeline serves ``method path``; else the 404/405 both front ends answer."""
    if path in GENERATE_ROUTES:
        allowed = "POST"
    elif path in PASSTHROUGH_ROUTES:
        allowed = PASSTHROUGH_ROUTES[path]
    else:
        served = ", ".join(sorted((*GENERATE_ROUTES, *PASSTHROUGH_ROUTES)))
        return refuse(404, f"no route {path}; the fleet serves {served}", "not_found")
    if method != allowed:
        return refuse(405, f"{method} is not allowed on {path}; use {allowed}", "method_not_allowed",
                      {"allow": allowed})
    return None


@dataclass(eq=False)
class ServingRequest:
    """One generate request on its way through the pipeline (pipeline.py fills in the rest)."""

    path: str
    chat: bool
    headers: CIMultiDictProxy[str]  # the client's, case-insensitive
    request_id: str  # sent on both legs (request_id.py)
    body: dict[str, Any]  # the client's JSON object, its kv_transfer_params dropped
    cost: float  # estimated tokens, for flow control's fairness (flow/cost.py)
    dropped_kv_params: bool = False
    reply_headers: dict[str, str] = field(default_factory=dict)  # what the client gets besides decode's own
    upstream_headers: dict[str, str] = field(default_factory=dict)  # what both legs carry


def read_request(path: str, headers: Mapping[str, str], raw: bytes, *, forward_headers: tuple[str, ...]
                 ) -> ServingRequest:
    """The body parsed once, as the engines will read it; raises Refusal (400) for what no engine
    would take. ``path`` must be one of GENERATE_ROUTES."""
    # the router's are case-insensitive already; the Endpoint Picker's are a plain dict
    hdrs = headers if isinstance(headers, CIMultiDictProxy) else CIMultiDictProxy(CIMultiDict(headers))
    request_id = upstream_request_id(hdrs.get(REQUEST_ID_HEADER))
    reply = {REQUEST_ID_HEADER.lower(): request_id}
    try:
        body = json_decode(raw)
    except msgspec.DecodeError as exc:  # includes a body nested past the bound (upstream.py)
        raise refuse(400, f"request body is not valid JSON: {exc}", "client_invalid_json", reply) from None
    if not isinstance(body, dict):
        raise refuse(400, f"request body must be a JSON object, got {type(body).__name__}", "client_not_object",
                     reply)
    chat = GENERATE_ROUTES[path]
    dropped = body.pop("kv_transfer_params", None) is not None  # only the fleet sets them
    upstream = {REQUEST_ID_HEADER: request_id, "Content-Type": JSON, "Accept-Encoding": "identity"}
    for name in forward_headers:
        value = hdrs.get(name)
        if value is not None:
            upstream[name] = value
    return ServingRequest(path, chat, hdrs, request_id, body, estimate_cost(body, chat=chat), dropped, reply,
                          upstream)
