"""The engines answer only the fleet (issue 30): every request the router (or the EPP) sends an
engine carries the fleet's API token as ``Authorization: Bearer``, replacing any Authorization the
client sent (a client's credentials are not the engines' business, and must not override the fleet's).

The token comes from the environment (``PDFLEET_ENGINE_API_KEY``, which the operator fills from the
fleet's generated Secret through secretKeyRef); without it (``pdfleet local``, tests) nothing is added.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Optional

import aiohttp

from pdfleet.contract import env as env_names

MAX_TOKEN = 512
_TOKEN = re.compile(r"^[A-Za-z0-9._~+/=-]+$")  # RFC 6750 b64token: nothing that could split a header


class EngineTokenError(ValueError):
    pass


def engine_token(environ: Mapping[str, str]) -> Optional[str]:
    """The token from the environment, None when unset or empty; a clear error when malformed."""
    value = environ.get(env_names.ENGINE_API_KEY, "").strip()
    if not value:
        return None
    if len(value) > MAX_TOKEN or not _TOKEN.match(value):
        raise EngineTokenError(f"{env_names.ENGINE_API_KEY} must be a bearer token of at most {MAX_TOKEN} "
                               "characters from A-Z a-z 0-9 . _ ~ + / = -")
    return value


def middlewares(environ: Mapping[str, str]) -> tuple:
    """aiohttp client middlewares for the session the router talks to engines with."""
    token = engine_token(environ)
    if token is None:
        return ()
    header = f"Bearer {token}"

    async def bearer(request: aiohttp.ClientRequest, handler) -> aiohttp.ClientResponse:
        request.headers["Authorization"] = header
        return await handler(request)

    return (bearer,)
