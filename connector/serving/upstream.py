"""What the router's legs share about talking to engines over HTTP (no state)."""

from __future__ import annotations

import functools

import msgspec
import yarl
from aiohttp import web

REQUEST_ID_HEADER = "X-Request-Id"
# 408/429 mean "this endpoint cannot take it now", not "the request is wrong".
RETRYABLE_4XX = frozenset((408, 429))
WHOLE_BODY_MAX = 1024 * 1024  # a sized, non-streamed answer up to this is relayed in one write

json_decode = msgspec.json.Decoder().decode
json_encode = msgspec.json.Encoder().encode

# Set by the relay: the status whose whole answer reached the client / the client left before the end.
DELIVERED = web.RequestKey("pdfleet_delivered", int)
CLIENT_LEFT = web.RequestKey("pdfleet_client_left", bool)


@functools.lru_cache(maxsize=4096)
def target(base: str, path: str) -> yarl.URL:
    """Parsed once per endpoint and route (aiohttp would parse the string on every request)."""
    return yarl.URL(base + path)


def auth_only(request: web.Request) -> dict[str, str]:
    value = request.headers.get("Authorization")
    return {"Authorization": value} if value else {}
