"""Errors in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

from __future__ import annotations

import msgspec
from aiohttp import web

_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_exceeded",  # shed by flow control (flow/gate.py)
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}


def error_body(status: int, message: str, *, param: str | None = None) -> bytes:
    err_type = _TYPES.get(status, "invalid_request_error" if status < 500 else "internal_server_error")
    return msgspec.json.encode({"error": {"message": message, "type": err_type, "param": param, "code": status}})


def error_response(status: int, message: str, *, param: str | None = None,
                   headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(status=status, body=error_body(status, message, param=param),
                        content_type="application/json", headers=headers)
