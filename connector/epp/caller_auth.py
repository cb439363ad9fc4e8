"""Who may call the Endpoint Picker: only a gateway that holds the fleet's caller token (docs/gateway.md,
"Who may call the Endpoint Picker").

Whoever opens an ext_proc stream gets what the EPP puts on the decode request (the fleet's engine token,
decode's address, prefill's signed kv_transfer_params) and has prefill legs run for it. So every call
must carry the token in the gRPC metadata key gateway.CALLER_TOKEN_METADATA (Envoy sends it with
grpc_service.initial_metadata); any other is refused with UNAUTHENTICATED before its method reads a
message. The check (``verdict``) is pure; ``CallerAuth`` is the grpc.aio interceptor around it.
"""

from __future__ import annotations

import hmac
import logging
import string
from collections.abc import Iterable
from typing import Any

import grpc
from prometheus_client import Counter

from pdfleet.contract.env import EPP_CALLER_TOKEN
from pdfleet.contract.gateway import CALLER_TOKEN_METADATA, INSECURE_ANY_CALLER_FLAG
from pdfleet.contract.metrics import EPP_UNAUTHENTICATED

log = logging.getLogger("pdfleet.epp")

# Why a call is refused (the reason label of EPP_UNAUTHENTICATED).
MISSING = "missing"  # no token sent
MISMATCH = "mismatch"  # a token, not the fleet's
REPEATED = "repeated"  # the key more than once: which one a proxy meant is not for the EPP to guess
REASONS = (MISSING, MISMATCH, REPEATED)
# The operator's tokens are 64 hex characters (32 random bytes); a short one is a typo or a placeholder.
MIN_TOKEN_CHARS = 32
# RFC 6750's b64token: safe in gRPC metadata and, unquoted or quoted, in an Envoy config.
TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "-._~+/=")
# grpc.health.v1 answers the kubelet's gRPC probes, which send no metadata, and tells nothing but health.
OPEN_METHOD_PREFIXES = ("/grpc.health.v1.Health/",)


class CallerTokenError(ValueError):
    """The EPP's caller setting is missing or unusable; the message names the variable or flag."""


def caller_token(token: str | None, *, any_caller: bool) -> str | None:
    """The token every caller must send, or None to serve any caller (only with ``any_caller``)."""
    if any_caller:
        if token is not None:
            raise CallerTokenError(f"{EPP_CALLER_TOKEN} and {INSECURE_ANY_CALLER_FLAG} exclude each other: "
                                   "give the token, or the flag to serve every caller")
        return None
    if token is None:
        raise CallerTokenError(f"{EPP_CALLER_TOKEN} is not set: the Endpoint Picker serves only the gateway that "
                               f"sends it (in {CALLER_TOKEN_METADATA}); {INSECURE_ANY_CALLER_FLAG} serves every "
                               "caller (only where nothing else can reach the port)")
    if len(token) < MIN_TOKEN_CHARS or not set(token) <= TOKEN_CHARS:
        raise CallerTokenError(f"{EPP_CALLER_TOKEN} must be at least {MIN_TOKEN_CHARS} characters, each a letter, "
                               "a digit or one of -._~+/= (a bearer token's characters)")
    return token


def _text(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


def verdict(metadata: Iterable[tuple[str, Any]], expected: bytes) -> str | None:
    """None when the call carries exactly one ``expected`` token, else why not (one of REASONS). The
    comparison takes the same time wherever the sent token first differs (hmac.compare_digest)."""
    sent = [_text(value) for key, value in metadata if key.lower() == CALLER_TOKEN_METADATA]
    if not sent:
        return MISSING
    if len(sent) > 1:
        return REPEATED
    return None if hmac.compare_digest(sent[0], expected) else MISMATCH


def is_open(method: str) -> bool:
    return method.startswith(OPEN_METHOD_PREFIXES)


async def _refuse(request_iterator, context) -> None:
    # never reads request_iterator: nothing the caller sent is parsed
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, "the Endpoint Picker serves only its gateway")


_REFUSAL = grpc.stream_stream_rpc_method_handler(_refuse)


class CallerAuth(grpc.aio.ServerInterceptor):
    """Refuses, with UNAUTHENTICATED, every call but the health service's that lacks the token."""

    def __init__(self, token: str, registry) -> None:
        self._expected = token.encode()
        self.refused = Counter(EPP_UNAUTHENTICATED, "gRPC calls the Endpoint Picker refused with UNAUTHENTICATED "
                               "(no caller token, or not the fleet's), by reason", ["reason"], registry=registry)
        self._logged: set[str] = set()

    async def intercept_service(self, continuation, handler_call_details):
        if is_open(handler_call_details.method):
            return await continuation(handler_call_details)
        reason = verdict(handler_call_details.invocation_metadata or (), self._expected)
        if reason is None:
            return await continuation(handler_call_details)
        self.refused.labels(reason).inc()
        if reason not in self._logged:  # once per reason: the metric counts the rest
            self._logged.add(reason)
            log.warning("refused a call to %s: caller token %s (%s counts them)", handler_call_details.method,
                        reason, EPP_UNAUTHENTICATED)
        return _REFUSAL


def interceptors(token: str | None, registry) -> list[grpc.aio.ServerInterceptor]:
    """The EPP server's interceptors: the caller check, or none when any caller is served."""
    return [] if token is None else [CallerAuth(token, registry)]
