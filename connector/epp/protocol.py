"""Pure rules of the Endpoint Picker: what the proxy's messages mean and what the EPP answers.

No I/O and no protobuf here (messages.py builds those), so every rule is table-tested in
tests/unit/epp.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from pdfleet.connector.serving import lease_release
from pdfleet.contract.gateway import SUBSET_HINT_KEY, SUBSET_HINT_NAMESPACE

TAKEN = "taken"  # decode answered < 400: it reads the prefill's blocks (or releases them itself)

# The routes whose body the EPP turns into a P/D request; "chat" says which shape.
GENERATE_PATHS = {"/v1/completions": False, "/v1/chat/completions": True}


class BadSubset(ValueError):
    """The proxy's subset hint is not a list of "ip:port" strings."""


def endpoint_address(url: str) -> str:
    """An engine's base URL as the proxy's ORIGINAL_DST cluster wants it: ``ip:port``."""
    parts = urlsplit(url)
    if not parts.hostname or parts.port is None:
        raise ValueError(f"endpoint URL {url!r} has no host:port (the gateway routes to ip:port)")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"{host}:{parts.port}"


def subset_hint(filter_metadata: Mapping[str, Any]) -> frozenset[str] | None:
    """The endpoints the proxy allows (``envoy.lb.subset_hint``), or None when it sent no hint.

    The value is a list of "ip:port" strings (GAIE); one comma-separated string is accepted too.
    """
    namespace = filter_metadata.get(SUBSET_HINT_NAMESPACE)
    if not isinstance(namespace, Mapping) or SUBSET_HINT_KEY not in namespace:
        return None
    value = namespace[SUBSET_HINT_KEY]
    if isinstance(value, str):
        items: Iterable[Any] = [v for v in value.split(",")]
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
        if item.strip():
            out.add(item.strip())
    return frozenset(out)


def within(candidates: Iterable[str], subset: Collection[str] | None) -> tuple[str, ...]:
    """The candidate URLs the proxy's subset allows (all of them without a hint)."""
    candidates = tuple(candidates)
    if subset is None:
        return candidates
    return tuple(u for u in candidates if endpoint_address(u) in subset)


def decode_body(body: Mapping[str, Any], kv_transfer_params: Mapping[str, Any] | None) -> dict[str, Any]:
    """What decode receives: the client's request, plus prefill's params when prefill succeeded."""
    out = dict(body)
    if kv_transfer_params is not None:
        out["kv_transfer_params"] = dict(kv_transfer_params)
    return out


def lease_verdict(status: int | None) -> str:
    """What decode's response status means for the prefill's lease: TAKEN, or why to release it.

    None: no response reached the EPP (the client left, or the proxy gave up before decode answered).
    """
    if status is None:
        return lease_release.CLIENT_GONE
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
