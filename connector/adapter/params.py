"""The request-level ``kv_transfer_params`` contract, as pure functions (no vLLM, no I/O).

kv_transfer_params arrive in the client's request body, so a decode server can see
any value at all. ``parse_remote_prefill`` turns a decode-side request's params into a
``RemotePrefill`` or raises ``InvalidTransferParams`` naming the field and what is
allowed; the scheduler side of the connector calls it before anything reaches a
worker, and a rejected request is computed locally (never a crash).

The keys and their versions are pdfleet.contract.kv_params (the router reads the same
schema); params of a newer major version are refused here, naming both versions.
``producer_params`` (the contract's ``produce``) builds what a prefill server returns.

Signed params (issue 19): with a fleet key, prefill adds ``pdfleet_signature``, an
HMAC-SHA256 with the fleet key over every field decode acts on (``SIGNED_FIELDS``), and
decode refuses params without a valid one: a client that can POST to a decode can then
neither point it at a host of its choosing nor swap in another request's blocks, and the
lease it carries is the prefill's. Sizes are bounded before anything is iterated
(block ids by the prompt, the lease by ``MAX_LEASE_AHEAD_SECONDS``).

Signature versions (the contract's docstring, 1.3): ``v2`` over ``SIGNED_FIELDS`` is what a
prefill writes; ``v1`` over ``SIGNED_FIELDS_V1`` (a not yet upgraded 1.2 prefill) is still
accepted, on params of version 1.2 or older only.

Since 1.4 a prefill signs ``v3`` over ``SIGNED_FIELDS_V3`` (``v2`` plus ``remote_lease_id``); ``v2`` is
accepted on params of version 1.3 or older only. 1.4 params must carry ``remote_lease_id`` (the
hold's random id, hex): decode names it in every lease message, and the READ waits for the source's
grant of that id (contract docstring, 1.4).

The lease (1.3): ``remote_lease_seconds`` is a duration, checked for range only (a number that is not
finite, or too large for a float, is refused like any other out-of-range value); the decode turns
it into a monotonic upper bound of the lease (``accepted_at`` + seconds) that lets a READ start
and bounds heartbeat retries; only the source's ack completes a pull. Params of 1.2 or older carry a wall-clock expiry, checked against
``now`` as before.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import msgspec

from pdfleet.connector.transfer import auth

from pdfleet.contract import kv_params as K
from pdfleet.contract import routing
from pdfleet.contract.kv_params import produce as producer_params

__all__ = [
    "InvalidTransferParams",
    "RemotePrefill",
    "parse_remote_prefill",
    "wants_remote_prefill",
    "wants_remote_decode",
    "num_tokens_to_pull",
    "producer_params",
    "sign_params",
    "verify_params",
    "release_target",
    "own_lease_to_release",
    "MAX_ID_LEN",
    "SIGNATURE_KEY",
    "SIGNED_FIELDS",
    "SIGNED_FIELDS_V1",
]

SIGNATURE_KEY = K.SIG_KEY
SIGNED_FIELDS = K.SIGNED_FIELDS
SIGNED_FIELDS_V1 = K.SIGNED_FIELDS_V1
# Signature version -> (HMAC domain, fields). A prefill signs with _SIG_VERSION.
_SIG_SCHEMES = {
    "v1": (b"pdfleet-kv-transfer-params-v1", SIGNED_FIELDS_V1),
    "v2": (b"pdfleet-kv-transfer-params-v2", K.SIGNED_FIELDS_V2),
    "v3": (b"pdfleet-kv-transfer-params-v3", K.SIGNED_FIELDS_V3),
}
# The newest params version each signature may cover: an older scheme leaves newer keys unsigned.
_SIG_COVERS = {"v1": (1, 2), "v2": (1, 3), "v3": K.VERSION}
_SIG_VERSION = "v3"
# Numbers a JSON encoder may write as integers (30.0 as 30): signed as floats.
_FLOAT_FIELDS = (K.REMOTE_LEASE_EXPIRY, K.REMOTE_LEASE_SECONDS)
# A lease further ahead than this is nonsense (leases are seconds to minutes).
MAX_LEASE_AHEAD_SECONDS = K.MAX_LEASE_SECONDS
# Refused params carrying more block ids than this are not checked for a release.
MAX_RELEASE_BLOCK_IDS = 65536

MAX_ID_LEN = routing.MAX_ID_LEN
# Block ids index a local cache; anything past this is nonsense whatever the cache size.
MAX_BLOCK_ID = 2**31 - 1
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")


class InvalidTransferParams(ValueError):
    """kv_transfer_params of one request are unusable; the message names the field."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"kv_transfer_params.{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class RemotePrefill:
    """A validated decode-side request: where its prompt's KV lives and which blocks."""

    remote_engine_id: str
    remote_request_id: str
    remote_host: str
    remote_port: int
    remote_block_ids: tuple[int, ...]
    tp_size: int
    remote_instance_id: str | None = None
    remote_lease_expiry: float | None = None  # params <= 1.2: the prefill's unix time
    remote_hosts: tuple[str, ...] = ()  # one per prefill node; () = every rank at remote_host
    remote_lease_seconds: float | None = None  # params >= 1.3: the lease's length
    remote_lease_id: bytes | None = None  # params >= 1.4: the hold's id, named in every lease message
    # params >= 1.3: an upper bound of the lease on this host's monotonic clock (accepted_at + seconds)
    lease_deadline: float | None = None

    @property
    def hosts(self) -> tuple[str, ...]:
        return self.remote_hosts or (self.remote_host,)


def _flag(params: Mapping[str, Any], key: str) -> bool:
    value = params.get(key, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise InvalidTransferParams(key, f"must be true or false, got {type(value).__name__} {value!r}")
    return value


def wants_remote_prefill(params: Any) -> bool:
    """True when a request asks to pull its prompt KV (do_remote_prefill is true).

    A non-bool flag raises ``InvalidTransferParams``; a non-dict params object too.
    """
    if params is None:
        return False
    if not isinstance(params, Mapping):
        raise InvalidTransferParams("(root)", f"must be a JSON object, got {type(params).__name__}")
    return _flag(params, K.DO_REMOTE_PREFILL)


def wants_remote_decode(params: Any) -> bool:
    """True when a prefill request must keep its blocks for a remote decode."""
    if params is None:
        return False
    if not isinstance(params, Mapping):
        raise InvalidTransferParams("(root)", f"must be a JSON object, got {type(params).__name__}")
    return _flag(params, K.DO_REMOTE_DECODE)


def _str(params: Mapping[str, Any], key: str, *, required: bool = True) -> str | None:
    value = params.get(key)
    if value is None:
        if required:
            raise InvalidTransferParams(key, "is required (a non-empty string)")
        return None
    if not isinstance(value, str) or not value:
        raise InvalidTransferParams(key, f"must be a non-empty string, got {type(value).__name__} {value!r}")
    if len(value) > MAX_ID_LEN:
        raise InvalidTransferParams(key, f"is {len(value)} characters long; at most {MAX_ID_LEN} are allowed")
    return value


def _int(params: Mapping[str, Any], key: str, lo: int, hi: int, *, default: int | None = None) -> int:
    value = params.get(key, default)
    if value is None:
        raise InvalidTransferParams(key, f"is required (an integer in [{lo}, {hi}])")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidTransferParams(key, f"must be an integer in [{lo}, {hi}], got {type(value).__name__} {value!r}")
    if not lo <= value <= hi:
        raise InvalidTransferParams(key, f"must be an integer in [{lo}, {hi}], got {value}")
    return value


def _host(params: Mapping[str, Any]) -> str:
    host = _str(params, K.REMOTE_HOST)
    assert host is not None
    return _check_host(host, K.REMOTE_HOST)


def _check_host(host: str, field: str) -> str:
    try:
        addr = ipaddress.ip_address(host)
    except ValueError:
        if not _HOSTNAME.match(host):
            raise InvalidTransferParams(field, f"{host!r} is neither an IP address nor a hostname") from None
        return host
    if addr.is_unspecified or addr.is_multicast:
        # 0.0.0.0 / :: would make decode dial itself.
        raise InvalidTransferParams(field, f"{host!r} is not a routable unicast address")
    return host


def _hosts(params: Mapping[str, Any], tp_size: int) -> tuple[str, ...]:
    raw = params.get(K.REMOTE_HOSTS)
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)) or not raw:
        raise InvalidTransferParams(K.REMOTE_HOSTS, f"must be a non-empty list of hosts, got {raw!r}")
    if tp_size % len(raw) != 0:
        raise InvalidTransferParams(
            K.REMOTE_HOSTS, f"has {len(raw)} hosts; the prefill's {tp_size} ranks must spread evenly over them")
    out = []
    for pos, host in enumerate(raw):
        field = f"remote_hosts[{pos}]"
        if not isinstance(host, str) or not host or len(host) > MAX_ID_LEN:
            raise InvalidTransferParams(field, f"must be a non-empty string of at most {MAX_ID_LEN} characters,"
                                               f" got {host!r}")
        out.append(_check_host(host, field))
    return tuple(out)


def _block_ids(params: Mapping[str, Any], most: int) -> tuple[int, ...]:
    raw = params.get(K.REMOTE_BLOCK_IDS)
    if raw is None:
        raise InvalidTransferParams(K.REMOTE_BLOCK_IDS, "is required (a list of block ids, or a list of one such list)")
    if not isinstance(raw, (list, tuple)):
        raise InvalidTransferParams(K.REMOTE_BLOCK_IDS, f"must be a list, got {type(raw).__name__}")
    # vLLM returns one list per KV-cache group; pdfleet supports exactly one group.
    if raw and all(isinstance(g, (list, tuple)) for g in raw):
        if len(raw) != 1:
            raise InvalidTransferParams(
                K.REMOTE_BLOCK_IDS, f"has {len(raw)} KV-cache groups; exactly one is supported"
            )
        raw = raw[0]
    if len(raw) > most:  # before looking at any element: the work stays bounded by the prompt
        raise InvalidTransferParams(K.REMOTE_BLOCK_IDS, f"has {len(raw)} ids but the prompt spans at most {most}")
    out: list[int] = []
    for pos, value in enumerate(raw):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidTransferParams(
                f"remote_block_ids[{pos}]", f"must be an integer, got {type(value).__name__} {value!r}"
            )
        if not 0 <= value <= MAX_BLOCK_ID:
            raise InvalidTransferParams(f"remote_block_ids[{pos}]", f"must be in [0, {MAX_BLOCK_ID}], got {value}")
        out.append(value)
    if len(set(out)) != len(out):
        raise InvalidTransferParams(K.REMOTE_BLOCK_IDS, "contains duplicate block ids")
    return tuple(out)


def _expiry(params: Mapping[str, Any]) -> float | None:
    value = params.get(K.REMOTE_LEASE_EXPIRY)
    if value is None:
        return None
    number = K._number(value)  # never raises: 10**400 is no float
    if number is None:
        raise InvalidTransferParams(K.REMOTE_LEASE_EXPIRY, f"must be a finite unix time (number), got {_short(value)}")
    return number


def _lease_seconds(params: Mapping[str, Any]) -> float | None:
    value = params.get(K.REMOTE_LEASE_SECONDS)
    if value is None:
        return None
    allowed = f"a number of seconds in (0, {MAX_LEASE_AHEAD_SECONDS:g}]"
    number = K._number(value)  # never raises: 10**400 is no float
    if number is None:
        raise InvalidTransferParams(K.REMOTE_LEASE_SECONDS, f"must be {allowed}, got {_short(value)}")
    if not 0 < number <= MAX_LEASE_AHEAD_SECONDS:
        raise InvalidTransferParams(K.REMOTE_LEASE_SECONDS, f"must be {allowed}, got {number:.6g}")
    return number


def _short(value: Any) -> str:
    """A value for an error message, bounded (a 400-digit integer is not echoed whole)."""
    text = repr(value) if not isinstance(value, int) or isinstance(value, bool) or abs(value) < 10**30 else (
        f"an integer of {len(str(abs(value)))} digits")
    return text if len(text) <= 80 else text[:77] + "..."


def _lease_id(params: Mapping[str, Any]) -> bytes:
    lease_id = K.lease_id_of(params)
    if lease_id is None:
        raise InvalidTransferParams(K.REMOTE_LEASE_ID, f"is required in params of version"
                                                       f" {K.version_string(K.LEASE_ID_SINCE)} or newer:"
                                                       f" {2 * K.lease_id_bytes} lowercase hex characters,"
                                                       f" got {_short(params.get(K.REMOTE_LEASE_ID))}")
    return lease_id


def num_tokens_to_pull(num_prompt_tokens: int, block_size: int) -> int:
    """Prompt tokens a decode pulls: full blocks only.

    A prompt shorter than one block pulls nothing. When the prompt fills its last
    block exactly, vLLM's scheduler still recomputes the last token locally (it needs
    its logits), rewriting the same slot.
    """
    if num_prompt_tokens <= 0 or block_size <= 0:
        return 0
    return (num_prompt_tokens // block_size) * block_size


def parse_remote_prefill(
    params: Any,
    *,
    num_prompt_tokens: int,
    block_size: int,
    local_tp_size: int,
    now: float,
    ring: Optional[auth.KeyRing] = None,
    accepted_at: Optional[float] = None,
) -> RemotePrefill:
    """Validate a do_remote_prefill request's params; raise ``InvalidTransferParams``.

    Checks the schema version (a newer major one is refused), types and ranges of every key, that ``remote_block_ids`` covers the
    blocks this decode will pull (at least the prompt's full blocks, at most one per
    started block plus one), that decode TP is a multiple of prefill ``tp_size``, and the lease:
    for 1.3 params a duration in (0, ``MAX_LEASE_AHEAD_SECONDS``], which with ``accepted_at`` (this
    host's monotonic time when the params arrived) gives ``lease_deadline``; for older params a
    unix expiry that has not passed by ``now`` (this host's wall clock) nor lies absurdly far
    ahead. With ``ring`` (this decode has a fleet key) the params must carry a valid
    ``pdfleet_signature``.
    """
    if not wants_remote_prefill(params):
        raise InvalidTransferParams(K.DO_REMOTE_PREFILL, "must be true for a remote prefill")
    assert isinstance(params, Mapping)
    try:
        version = K.version_of(params)
    except K.UnsupportedVersion as exc:
        raise InvalidTransferParams(exc.field, exc.problem) from None
    if _flag(params, K.DO_REMOTE_DECODE):
        raise InvalidTransferParams(K.DO_REMOTE_DECODE, "cannot be true together with do_remote_prefill")
    engine_id = _str(params, K.REMOTE_ENGINE_ID)
    request_id = _str(params, K.REMOTE_REQUEST_ID)
    host = _host(params)
    port = _int(params, K.REMOTE_PORT, 1, 65535)
    tp_size = _int(params, K.TP_SIZE, 1, 1024, default=1)
    if local_tp_size % tp_size != 0:
        raise InvalidTransferParams(
            K.TP_SIZE, f"prefill tp_size {tp_size} must divide decode tp_size {local_tp_size} (decode TP = k x prefill TP)"
        )
    hosts = _hosts(params, tp_size)
    instance_id = _str(params, K.REMOTE_INSTANCE_ID, required=False)
    if instance_id is not None and len(instance_id.split(",")) != tp_size:
        raise InvalidTransferParams(
            K.REMOTE_INSTANCE_ID, f"must list one instance id per prefill rank ({tp_size}), comma-separated"
        )
    remote_num_tokens = params.get(K.REMOTE_NUM_TOKENS)
    if remote_num_tokens is not None:
        _int(params, K.REMOTE_NUM_TOKENS, 0, 2**31 - 1)
        if remote_num_tokens < num_tokens_to_pull(num_prompt_tokens, block_size):
            raise InvalidTransferParams(
                K.REMOTE_NUM_TOKENS,
                f"prefill computed {remote_num_tokens} tokens, fewer than the {num_prompt_tokens}-token prompt"
                " needs (was the prompt changed between the two legs?)",
            )
    need = num_tokens_to_pull(num_prompt_tokens, block_size) // block_size
    most = -(-num_prompt_tokens // block_size) + 1
    block_ids = _block_ids(params, most)
    if len(block_ids) < need:
        raise InvalidTransferParams(
            K.REMOTE_BLOCK_IDS,
            f"has {len(block_ids)} ids but the {num_prompt_tokens}-token prompt needs at least {need}"
            f" (one per full block of {block_size} tokens)",
        )
    if len(block_ids) > most:
        raise InvalidTransferParams(
            K.REMOTE_BLOCK_IDS,
            f"has {len(block_ids)} ids but a {num_prompt_tokens}-token prompt spans at most {most}",
        )
    expiry = seconds = deadline = lease_id = None
    if version >= K.LEASE_ID_SINCE:
        lease_id = _lease_id(params)
    if version >= K.LEASE_SECONDS_SINCE:
        seconds = _lease_seconds(params)  # a duration: no clock of another host is read
        if seconds is not None and accepted_at is not None:
            deadline = accepted_at + seconds
    else:
        expiry = _expiry(params)
    if expiry is not None and expiry <= now:
        raise InvalidTransferParams(K.REMOTE_LEASE_EXPIRY, f"the prefill lease expired {now - expiry:.1f}s ago")
    if expiry is not None and expiry > now + MAX_LEASE_AHEAD_SECONDS:
        raise InvalidTransferParams(K.REMOTE_LEASE_EXPIRY, f"is {expiry - now:.3g}s ahead; at most"
                                                          f" {MAX_LEASE_AHEAD_SECONDS:g}s are allowed")
    if ring is not None:
        verify_params(params, ring)
    assert engine_id is not None and request_id is not None
    return RemotePrefill(
        remote_engine_id=engine_id,
        remote_request_id=request_id,
        remote_host=host,
        remote_port=port,
        remote_block_ids=block_ids,
        tp_size=tp_size,
        remote_instance_id=instance_id,
        remote_lease_expiry=expiry,
        remote_hosts=hosts,
        remote_lease_seconds=seconds,
        lease_deadline=deadline,
        remote_lease_id=lease_id,
    )


def _canonical(params: Mapping[str, Any], version: str = _SIG_VERSION) -> bytes:
    """The signed bytes of signature ``version``: its fields in a fixed order, numbers normalised as
    JSON would carry them."""
    domain, fields = _SIG_SCHEMES[version]
    values = []
    try:
        for key in fields:
            value = params.get(key)
            if key in _FLOAT_FIELDS and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)  # a JSON encoder may write 1.7e9 as an integer (10**400: OverflowError)
            values.append(value)
        return msgspec.msgpack.encode([domain, values])
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidTransferParams(SIGNATURE_KEY, f"the signed fields cannot be encoded: {exc}") from None


def sign_params(params: Mapping[str, Any], key: bytes, version: str = _SIG_VERSION) -> str:
    """The ``pdfleet_signature`` value for ``params`` under fleet key ``key`` (``version`` "v1": as a
    1.2 prefill signs, for tests of a rolling upgrade)."""
    mac = hmac.new(key, _canonical(params, version), hashlib.sha256).hexdigest()
    return f"{version}.{auth.key_id(key).hex()}.{mac}"


def verify_params(params: Mapping[str, Any], ring: auth.KeyRing) -> None:
    """Raise ``InvalidTransferParams`` (field ``pdfleet_signature``) unless a key of ``ring`` signed ``params``."""
    value = params.get(SIGNATURE_KEY)
    if value is None:
        raise InvalidTransferParams(SIGNATURE_KEY, "is required: this decode has a fleet key and pulls only what a"
                                                   " prefill of the fleet signed")
    parts = value.split(".") if isinstance(value, str) and len(value) <= 200 else []
    if len(parts) != 3 or parts[0] not in _SIG_SCHEMES:
        raise InvalidTransferParams(SIGNATURE_KEY, f"must be '{_SIG_VERSION}.<key id>.<hmac>' (hex), or 'v2.…' on"
                                                   " params of version 1.3 or older, 'v1.…' on 1.2 or older")
    covers = _SIG_COVERS[parts[0]]
    if covers < K.VERSION:
        try:
            version = K.version_of(params)
        except K.UnsupportedVersion as exc:
            raise InvalidTransferParams(exc.field, exc.problem) from None
        if version > covers:  # an older scheme leaves the newer keys (duration, version, lease id) unsigned
            raise InvalidTransferParams(SIGNATURE_KEY, f"a {parts[0]} signature covers params of version"
                                                       f" {K.version_string(covers)} or older only; these are"
                                                       f" {params.get(K.VERSION_KEY)}: sign them {_SIG_VERSION}")
    try:
        kid, mac = bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
    except ValueError:
        raise InvalidTransferParams(SIGNATURE_KEY, "key id and hmac must be hex") from None
    key = ring.lookup(kid)
    if key is None:
        raise InvalidTransferParams(SIGNATURE_KEY, "signed with a key this decode does not accept")
    if not hmac.compare_digest(hmac.new(key, _canonical(params, parts[0]), hashlib.sha256).digest(), mac):
        raise InvalidTransferParams(SIGNATURE_KEY, "does not match the params (changed after the prefill signed them)")


def release_target(params: Any, ring: Optional[auth.KeyRing]) -> Optional[tuple[str, int, int, str, tuple[str, ...]]]:
    """(host, port, tp_size, remote request id, hosts) of refused params a release may be sent to: only
    when a fleet key signed them (never dial a host a client named), and only when they are well formed."""
    if ring is None or not isinstance(params, Mapping):
        return None
    raw = params.get(K.REMOTE_BLOCK_IDS)
    if not isinstance(raw, (list, tuple)) or len(raw) > MAX_RELEASE_BLOCK_IDS:
        return None
    groups = [g for g in raw if isinstance(g, (list, tuple))]
    if len(groups) > 1 or sum(len(g) for g in groups) > MAX_RELEASE_BLOCK_IDS:
        return None  # no HMAC over a million ids: the work to refuse must stay small
    try:
        verify_params(params, ring)
        tp = _int(params, K.TP_SIZE, 1, 1024, default=1)
        request_id = _str(params, K.REMOTE_REQUEST_ID)
        assert request_id is not None
        return _host(params), _int(params, K.REMOTE_PORT, 1, 65535), tp, request_id, _hosts(params, tp)
    except InvalidTransferParams:
        return None


def own_lease_to_release(params: Any, *, engine_id: str, ring: Optional[auth.KeyRing]) -> str:
    """The request id of this prefill's own lease that a release request (``RELEASE_KEY``, sent by the
    router when no decode will read it) names; raise ``InvalidTransferParams`` naming the field.

    Only the engine that produced the params acts on them (``remote_engine_id`` is its own), and with
    a fleet key only on params it signed itself, so a client can release nothing it was not handed.
    What the release may free is bounded further by the lease table: only a lease no reader claimed."""
    if not isinstance(params, Mapping):
        raise InvalidTransferParams("(root)", f"must be a JSON object, got {type(params).__name__}")
    try:
        K.version_of(params)
    except K.UnsupportedVersion as exc:
        raise InvalidTransferParams(exc.field, exc.problem) from None
    engine = _str(params, K.REMOTE_ENGINE_ID)
    if engine != engine_id:
        raise InvalidTransferParams(K.REMOTE_ENGINE_ID, f"names engine {engine!r}, not this prefill ({engine_id!r}):"
                                                        " a prefill releases only its own leases")
    request_id = _str(params, K.REMOTE_REQUEST_ID)
    assert request_id is not None
    if ring is not None:
        raw = params.get(K.REMOTE_BLOCK_IDS)
        if not isinstance(raw, (list, tuple)) or len(raw) > MAX_RELEASE_BLOCK_IDS or sum(
                len(g) for g in raw if isinstance(g, (list, tuple))) > MAX_RELEASE_BLOCK_IDS:
            raise InvalidTransferParams(K.REMOTE_BLOCK_IDS, "must be the list this prefill returned")
        verify_params(params, ring)
    return request_id
