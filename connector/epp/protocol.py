"""Pure rules of the Endpoint Picker: what the proxy's messages mean and what the EPP answers.

No I/O and no protobuf here (messages.py builds those), so every rule is table-tested in
tests/unit/epp.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from pdfleet.connector.serving import lease_release
from pdfleet.contract.gateway import (
    DESTINATION_METADATA_NAMESPACE,
    DESTINATION_SERVED_KEY,
    SUBSET_HINT_KEY,
    SUBSET_HINT_NAMESPACE,
)

TAKEN = "taken"  # decode answered < 400: it reads the prefill's blocks (or releases them itself)
# No decode status reached the EPP and none was to come (the gateway sends no response headers): whether
# decode read the lease is unknown, so it is left to decode and to its expiry, not released.
UNOBSERVED = "unobserved"

# ext_proc body modes (envoy ProcessingMode.BodySendMode names)
NONE, STREAMED, BUFFERED = "NONE", "STREAMED", "BUFFERED"
BUFFERED_PARTIAL, FULL_DUPLEX = "BUFFERED_PARTIAL", "FULL_DUPLEX_STREAMED"

# What the EPP answers one response body message, by response_body_mode.
ECHO = "echo"  # the chunk back as a streamed body mutation, end_of_stream passed through
ACK = "ack"  # an empty BodyResponse: the chunk (STREAMED) or the whole body (BUFFERED) goes on unchanged


class BadSubset(ValueError):
    """The proxy's subset hint is not a list of endpoint strings."""


def endpoint_address(url: str) -> str:
    """An engine's base URL as the proxy's ORIGINAL_DST cluster wants it: ``ip:port``."""
    parts = urlsplit(url)
    if not parts.hostname or parts.port is None:
        raise ValueError(f"endpoint URL {url!r} has no host:port (the gateway routes to ip:port)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port}"


def _subset_item(item: str) -> str:
    """One endpoint of a subset hint as ``within`` matches it: "ip:port", or a bare IP (any port of it;
    an IPv6 one bracketed as endpoint_address writes it)."""
    if item.count(":") > 1 and not item.startswith("["):  # a bare IPv6 address
        return f"[{item}]"
    return item


def subset_hint(filter_metadata: Mapping[str, Any]) -> frozenset[str] | None:
    """The endpoints the proxy allows (``envoy.lb.subset_hint``), or None when it sent no hint.

    As GAIE's reference EPP reads it: a list of strings, each "ip:port", a bare IP (any port of that IP)
    or several of those comma-separated; one string is read as one such item.
    """
    namespace = filter_metadata.get(SUBSET_HINT_NAMESPACE)
    if not isinstance(namespace, Mapping) or SUBSET_HINT_KEY not in namespace:
        return None
    value = namespace[SUBSET_HINT_KEY]
    if isinstance(value, str):
        items: Iterable[Any] = [value]
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise BadSubset(f"metadata {SUBSET_HINT_NAMESPACE}.{SUBSET_HINT_KEY} must be a list of \"ip:port\" "
                        f"strings, got {type(value).__name__}")
    out = set()
    for item in items:
        if not isinstance(item, str):
            raise BadSubset(f"metadata {SUBSET_HINT_NAMESPACE}.{SUBSET_HINT_KEY} must hold \"ip:port\" strings, "
                            f"got {type(item).__name__}")
        out.update(_subset_item(part.strip()) for part in item.split(",") if part.strip())
    return frozenset(out)


def within(candidates: Iterable[str], subset: Collection[str] | None) -> tuple[str, ...]:
    """The candidate URLs the proxy's subset allows (all of them without a hint): an "ip:port" item
    allows that endpoint, a bare IP item every port of that IP."""
    candidates = tuple(candidates)
    if subset is None:
        return candidates
    return tuple(u for u in candidates if _allowed(endpoint_address(u), subset))


def _allowed(address: str, subset: Collection[str]) -> bool:
    return address in subset or address.rpartition(":")[0] in subset


def served_endpoint(filter_metadata: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """The "ip:port" that served the request, as the gateway reports it (GAIE's Endpoint Picker Protocol,
    "Destination Endpoint Served"): metadata ``envoy.lb`` first, else a response header of the same name;
    None when the gateway sends neither; of a list, the first."""
    namespace = filter_metadata.get(DESTINATION_METADATA_NAMESPACE)
    value = namespace.get(DESTINATION_SERVED_KEY) if isinstance(namespace, Mapping) else None
    if not isinstance(value, str) or not value.strip():
        value = headers.get(DESTINATION_SERVED_KEY, "")
    first = value.split(",", 1)[0].strip()
    return first or None


def served_url(served: str | None, chosen: str | None, candidates: Iterable[str]) -> str | None:
    """The engine URL behind the served ``ip:port``: ``chosen`` when the gateway names no other (or one
    the EPP does not know), else the known candidate at that address."""
    if served is None or chosen is None or endpoint_address(chosen) == served:
        return chosen
    for url in candidates:
        if endpoint_address(url) == served:
            return url
    return chosen


def response_body_reply(mode: str) -> str:
    """How the EPP answers a response body message under ``response_body_mode`` ``mode``: FULL_DUPLEX_STREAMED
    waits for each chunk back (an empty answer there is "spurious" and fails the stream); STREAMED,
    BUFFERED and BUFFERED_PARTIAL take an empty answer per message, leaving the body as it is."""
    return ECHO if mode == FULL_DUPLEX else ACK


def lease_verdict(status: int | None, *, status_expected: bool = True) -> str:
    """What decode's response status means for the prefill's lease: TAKEN, UNOBSERVED, or why to release it.

    None: no response reached the EPP. Where one was expected (the gateway sends response headers),
    the client left or the proxy gave up before decode answered; otherwise nothing is known.
    """
    if status is None:
        return lease_release.CLIENT_GONE if status_expected else UNOBSERVED
    if status >= 500:
        return lease_release.DECODE_FAILED
    if status >= 400:  # refused before its engine ran: it reads nothing
        return lease_release.DECODE_REFUSED
    return TAKEN


def header_map(pairs: Iterable[tuple[str, bytes | str]]) -> dict[str, str]:
    """The proxy's headers as a dict with lower-case keys (HTTP/2 style; pseudo-headers kept)."""
    out: dict[str, str] = {}
    for key, value in pairs:
        out[key.lower()] = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return out


# What the EPP asks of the gateway's ext_proc filter (logged at start; docs/gateway.md, "Processing modes").
GATEWAY_NEEDS = ("request_header_mode SEND; request_body_mode BUFFERED or FULL_DUPLEX_STREAMED (STREAMED only with "
                 "allow_mode_override: true, the EPP then asks for BUFFERED); response_header_mode SEND (or "
                 "allow_mode_override: true, the EPP then asks for it); any response_body_mode")


def mode_override(request_mode: str, response_mode: str) -> dict[str, str] | None:
    """The processing mode the EPP asks for in its answer to the request headers, or None.

    It needs the whole body before the headers go on (so a STREAMED request body becomes BUFFERED) and
    decode's response headers (its status: which lease to release, which decode to eject). Envoy honours
    the override only with allow_mode_override, and then replaces the whole mode with it, so the EPP asks
    on every request (it cannot tell a config that sends response headers from one that honours its
    override). Envoy ignores it where a body mode is FULL_DUPLEX_STREAMED: none is asked there."""
    if FULL_DUPLEX in (request_mode, response_mode):
        return None
    return {"request_header_mode": "SEND", "response_header_mode": "SEND",
            "request_body_mode": BUFFERED if request_mode == STREAMED else request_mode,
            "response_body_mode": response_mode, "request_trailer_mode": "SKIP", "response_trailer_mode": "SKIP"}


def streamed_too_early(request_mode: str, end_of_stream: bool) -> bool:
    """A STREAMED request body arriving in pieces: the proxy did not take the EPP's BUFFERED override, so
    the request's headers went on before the EPP could name the decode (and the body is not whole)."""
    return request_mode == STREAMED and not end_of_stream


def mode_problems(request_mode: str, response_mode: str) -> list[str]:
    """What cannot work, or works only with allow_mode_override, under these body modes (logged once)."""
    out = []
    if request_mode == STREAMED and response_mode == FULL_DUPLEX:
        out.append("request_body_mode STREAMED with response_body_mode FULL_DUPLEX_STREAMED: Envoy takes no "
                   "mode_override there, so the proxy sends the headers on before the body is whole, and a "
                   "request whose body comes in more than one piece is refused (500); stream both or neither")
    elif request_mode == STREAMED:
        out.append("request_body_mode STREAMED: the EPP asks for BUFFERED (mode_override); without "
                   "allow_mode_override: true the proxy sends the headers on before the body is whole, and a "
                   "request whose body comes in more than one piece is refused (500)")
    if request_mode in (NONE, BUFFERED_PARTIAL):
        out.append(f"request_body_mode {request_mode}: the EPP never sees a whole request body before the headers "
                   "go on, so it cannot route requests that have one (set BUFFERED or FULL_DUPLEX_STREAMED)")
    if response_mode == BUFFERED:
        out.append("response_body_mode BUFFERED: the proxy holds decode's whole answer before the client sees "
                   "any of it (streamed answers arrive at once; answers over its buffer limit fail)")
    return out


def response_headers_presumed(response_mode: str) -> bool:
    """Whether decode's response headers are presumed to reach the EPP before any has: a config that sends
    response bodies sends their headers (pdfleet's and GAIE's FULL_DUPLEX_STREAMED configs); one with no
    response body (GAIE's earlier BUFFERED config skips response headers too) is not presumed to."""
    return response_mode != NONE


NO_RESPONSE_HEADERS = ("no response headers reached the EPP for a request it routed ({modes}): the gateway's "
                       "ext_proc filter has response_header_mode SKIP and no allow_mode_override. The EPP cannot "
                       "see decode's status: leases a decode did not read wait out their lease instead of being "
                       "released, and a failing decode is not ejected. Set response_header_mode: SEND (or "
                       "allow_mode_override: true)")
