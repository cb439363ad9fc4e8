"""What the router's legs share about talking to engines over HTTP (no state)."""

from __future__ import annotations

import functools
from typing import Any

import aiohttp
import msgspec
import yarl
from aiohttp import web

from pdfleet.connector.serving.json_depth import check_depth

REQUEST_ID_HEADER = "X-Request-Id"
# 408/429 mean "this endpoint cannot take it now", not "the request is wrong".
RETRYABLE_4XX = frozenset((408, 429))
WHOLE_BODY_MAX = 1024 * 1024  # a sized, non-streamed answer up to this is relayed in one write

_decode = msgspec.json.Decoder().decode
json_encode = msgspec.json.Encoder().encode

# Set by the relay: the status whose whole answer reached the client / the client left before the end.
DELIVERED = web.RequestKey("pdfleet_delivered", int)
CLIENT_LEFT = web.RequestKey("pdfleet_client_left", bool)


def json_decode(raw: bytes) -> Any:
    """A JSON text from a client or an engine; nesting past json_depth.MAX_JSON_DEPTH raises
    json_depth.TooDeep, a msgspec.DecodeError (so a 400 where invalid JSON is one), not RecursionError."""
    check_depth(raw)
    return _decode(raw)


async def read_bounded(resp: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """An engine's answer, or None once it passes ``limit`` bytes (by its Content-Length before reading,
    else while reading: no more than ``limit`` plus one chunk is ever held)."""
    if resp.content_length is not None:
        # sized within the bound: one read (aiohttp stops at Content-Length); the usual engine answer
        return None if resp.content_length > limit else await resp.read()
    chunks, size = [], 0
    async for chunk in resp.content.iter_any():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


@functools.lru_cache(maxsize=4096)
def target(base: str, path: str) -> yarl.URL:
    """Parsed once per endpoint and route (aiohttp would parse the string on every request)."""
    return yarl.URL(base + path)


def auth_only(request: web.Request) -> dict[str, str]:
    value = request.headers.get("Authorization")
    return {"Authorization": value} if value else {}
