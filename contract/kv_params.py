"""``kv_transfer_params``: one versioned schema, written and read here only.

A prefill engine returns these params in its response (``produce``); the router forwards them
to decode unchanged. Every read is here:

- strict, for decode (``parse_remote_prefill``, ``release_target``, ``own_lease_to_release``):
  every key decode acts on is checked, sizes are bounded before anything is iterated, and bad
  input raises ``InvalidTransferParams`` naming the field and what is allowed. The signature check
  is passed in (``verify``): the fleet key's HMAC lives with the connector (adapter/signed_params.py).
- lenient, for the router (``lease_deadline``, ``release_outcome``): an unusable value reads as
  None or "not understood", never an error; the router then takes the safe path.

Key names follow vLLM's NixlConnector (``do_remote_prefill``, ``do_remote_decode``,
``remote_block_ids``, ``remote_engine_id``, ``remote_request_id``, ``remote_host``,
``remote_port``, ``tp_size``, ``remote_num_tokens``) plus pdfleet's ``remote_instance_id``
(restart detection) and ``remote_hosts`` (one side-channel host per node of a multi-node prefill).

Version history (``pdfleet_params_version``, "MAJOR.MINOR"; a missing key reads as 1.0):
  1.0: engines before the schema had a version; same keys as 1.1
  1.1: adds the version key itself
  1.2: adds ``pdfleet_signature``: ``v1`` HMAC with the fleet key over ``SIGNED_FIELDS_V1``
  1.3: the lease is a duration, ``remote_lease_seconds`` (no more ``remote_lease_expiry``, unix time); ``v2`` signature
  1.4: single-use leases: ``remote_lease_id`` (16 random bytes, hex), required; ``v3`` signature

A minor version only adds optional keys (1.3 also stops writing one), so a reader of 1.x reads any
1.y; a newer major version is refused (``UnsupportedVersion``, naming both). A verifier accepts
``v1`` on params of 1.2 or older only and ``v2`` on 1.3 or older only (an older scheme leaves the
newer keys unsigned); 1.2 params are read the 1.2 way (the wall-clock expiry, no duration), 1.3
params the 1.3 way (no lease id). Readers that check no signature (the router, decodes without a
key) ignore ``pdfleet_signature``. A reader adds ``remote_lease_seconds`` to its own monotonic time
of receipt: an upper bound of the lease, which never compares two hosts' clocks. What each version
means for a rolling upgrade (upgrade decodes and routers before prefills): docs/connector-core.md,
"kv_transfer_params versions".
"""

from __future__ import annotations

import ipaddress
import math
import re
import secrets
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from pdfleet.contract.routing import MAX_ID_LEN

VERSION_KEY = "pdfleet_params_version"
VERSION = (1, 4)
# The first version whose lease is a duration (``remote_lease_seconds``) instead of an instant.
LEASE_SECONDS_SINCE = (1, 3)
# The first version whose lease is single-use: ``remote_lease_id`` names it (required from then on).
LEASE_ID_SINCE = (1, 4)
# A lease id's length in bytes. Lower case on purpose: the plain number 16 elsewhere is not this value
# (test_contract_spelled_once); code asks ``is_lease_id`` and makes ids with ``new_lease_id``.
lease_id_bytes = 16
SIG_KEY = "pdfleet_signature"  # the prefill's signature (1.2; v2 since 1.3, v3 since 1.4), see SIGNED_FIELDS
ERROR_KEY = "pdfleet_error"  # why a prefill returned no usable params
# A request key, not a produced one (no version change): the router sends a prefill's params back to
# that prefill with this key true when no decode will read them; the prefill's reply carries it true
# when it queued the release of its own lease (see ``release_request``).
RELEASE_KEY = "pdfleet_release"

DO_REMOTE_PREFILL = "do_remote_prefill"
DO_REMOTE_DECODE = "do_remote_decode"
REMOTE_BLOCK_IDS = "remote_block_ids"
REMOTE_ENGINE_ID = "remote_engine_id"
REMOTE_REQUEST_ID = "remote_request_id"
REMOTE_HOST = "remote_host"
REMOTE_PORT = "remote_port"
TP_SIZE = "tp_size"
REMOTE_INSTANCE_ID = "remote_instance_id"
REMOTE_LEASE_EXPIRY = "remote_lease_expiry"  # up to 1.2: unix time (read only from params <= 1.2)
REMOTE_LEASE_SECONDS = "remote_lease_seconds"  # 1.3: seconds held, counted from when prefill returned them
REMOTE_NUM_TOKENS = "remote_num_tokens"
REMOTE_HOSTS = "remote_hosts"
REMOTE_LEASE_ID = "remote_lease_id"  # 1.4: the hold's random id, hex (lease_id_bytes bytes)
# What the signature covers: every key decode acts on (where it dials, what it reads, for how long).
# v1 (1.2 params): this list. Still verified, on params of version <= 1.2 only.
SIGNED_FIELDS_V1 = (REMOTE_ENGINE_ID, REMOTE_REQUEST_ID, REMOTE_HOST, REMOTE_HOSTS, REMOTE_PORT, TP_SIZE,
                    REMOTE_BLOCK_IDS, REMOTE_INSTANCE_ID, REMOTE_LEASE_EXPIRY, REMOTE_NUM_TOKENS)
# v2 (1.3 params): the v1 list (an absent expiry is signed as absent, so none can be added), the
# lease duration, and the version, so that 1.3 params cannot be passed off as an older version.
SIGNED_FIELDS_V2 = SIGNED_FIELDS_V1 + (REMOTE_LEASE_SECONDS, VERSION_KEY)
# v3 (1.4 params): the v2 list and the lease id (an absent one is signed as absent).
SIGNED_FIELDS_V3 = SIGNED_FIELDS_V2 + (REMOTE_LEASE_ID,)
SIGNED_FIELDS = SIGNED_FIELDS_V3  # what a prefill of this version signs
# A lease further ahead than this is nonsense (leases are seconds to minutes); a float, so that
# the number 3600 elsewhere is not taken for this value (test_contract_spelled_once).
MAX_LEASE_SECONDS = 3600.0

_VERSION = re.compile(r"^(\d{1,4})\.(\d{1,4})$")


class UnsupportedVersion(ValueError):
    """The params are of a version this reader cannot read; the message says which and why."""

    def __init__(self, problem: str):
        super().__init__(f"kv_transfer_params.{VERSION_KEY}: {problem}")
        self.field = VERSION_KEY
        self.problem = problem


def version_string(version: tuple[int, int] = VERSION) -> str:
    return f"{version[0]}.{version[1]}"


def version_of(params: Mapping[str, Any]) -> tuple[int, int]:
    """The params' version; a missing key is 1.0. Raises ``UnsupportedVersion`` when the value is
    malformed or of a newer major version than this reader's."""
    raw = params.get(VERSION_KEY)
    if raw is None:
        return (1, 0)
    m = _VERSION.match(raw) if isinstance(raw, str) else None
    if m is None:
        raise UnsupportedVersion(f'must be a string "MAJOR.MINOR", got {raw!r}')
    version = (int(m.group(1)), int(m.group(2)))
    if version[0] > VERSION[0]:
        raise UnsupportedVersion(
            f"version {raw} is newer than this reader's {version_string()}: a major version changes"
            f" keys this reader would misread; upgrade the reader (router or decode engine) first")
    if version[0] < 1:
        raise UnsupportedVersion(f"version {raw} does not exist (the first is 1.0)")
    return version


def remote_decode_request() -> dict[str, Any]:
    """What the router sends with the prefill leg: keep the blocks for a remote decode."""
    return {DO_REMOTE_DECODE: True}


def release_request(params: Mapping[str, Any]) -> dict[str, Any]:
    """The kv_transfer_params of the small request the router sends to the prefill that returned
    ``params`` when no decode will read them (decode refused the request, none was reached, or the
    client left): the params as the prefill signed them, plus ``RELEASE_KEY``. The prefill checks
    its own signature and frees the lease unless a reader has claimed it (connector/adapter)."""
    out = dict(params)
    out[RELEASE_KEY] = True
    return out


def wants_release(params: Any) -> bool:
    return isinstance(params, Mapping) and params.get(RELEASE_KEY) is True


def release_reply() -> dict[str, Any]:
    """What a prefill returns for a release request it accepted (the lease is freed in its next step
    unless a reader claimed it meanwhile)."""
    return {RELEASE_KEY: True}


def error_params(reason: str) -> dict[str, Any]:
    """What a prefill returns when it keeps no blocks for decode (decode then computes alone)."""
    return {DO_REMOTE_PREFILL: False, DO_REMOTE_DECODE: False, ERROR_KEY: reason}


def produce(
    *,
    block_ids: list[int],
    engine_id: str,
    request_id: str,
    host: str,
    port: int,
    tp_size: int,
    instance_id: str | None,
    lease_seconds: float,
    num_tokens: int,
    hosts: tuple[str, ...] = (),
    lease_id: bytes | None = None,
) -> dict[str, Any]:
    """The params a prefill returns (this version); the router forwards them to decode as-is.
    ``lease_seconds``: how long the prefill holds the blocks from now (its lease length; the hold
    is made after this, so the source's lease ends no earlier). ``lease_id``: the hold's random id
    (``lease_id_bytes`` bytes; the same one goes to the source's hold; None: a fresh one, read it
    back with ``lease_id_of``)."""
    if lease_id is None:
        lease_id = new_lease_id()
    if not is_lease_id(lease_id):
        raise ValueError(f"lease_id must be {lease_id_bytes} random bytes, got {lease_id!r}")
    extra = {REMOTE_HOSTS: list(hosts)} if hosts else {}
    return extra | {
        VERSION_KEY: version_string(),
        DO_REMOTE_PREFILL: True,
        DO_REMOTE_DECODE: False,
        REMOTE_BLOCK_IDS: [list(block_ids)],
        REMOTE_ENGINE_ID: engine_id,
        REMOTE_REQUEST_ID: request_id,
        REMOTE_HOST: host,
        REMOTE_PORT: port,
        TP_SIZE: tp_size,
        REMOTE_INSTANCE_ID: instance_id,
        REMOTE_LEASE_SECONDS: float(lease_seconds),
        REMOTE_NUM_TOKENS: num_tokens,
        REMOTE_LEASE_ID: lease_id.hex(),
    }


def _number(value: Any) -> float | None:
    """A finite float, or None: never raises (an integer too large for a float, 10**400 from JSON, is None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        out = float(value)
    except OverflowError:
        return None
    return out if math.isfinite(out) else None


_LEASE_ID = re.compile(rf"^[0-9a-f]{{{2 * lease_id_bytes}}}$")


def new_lease_id() -> bytes:
    """A fresh random lease id (params 1.4), for one hold."""
    return secrets.token_bytes(lease_id_bytes)


def is_lease_id(value: Any) -> bool:
    return isinstance(value, bytes) and len(value) == lease_id_bytes


def lease_id_of(params: Mapping[str, Any]) -> bytes | None:
    """The lease id of 1.4 params as bytes, or None when the value is missing or not
    ``2 * lease_id_bytes`` lowercase hex characters (older params carry none: None)."""
    raw = params.get(REMOTE_LEASE_ID)
    if not isinstance(raw, str) or not _LEASE_ID.match(raw):
        return None
    return bytes.fromhex(raw)


def lease_seconds(params: Mapping[str, Any]) -> float | None:
    """The lease duration of 1.3 params (``remote_lease_seconds``) if it is usable: a finite number
    in (0, ``MAX_LEASE_SECONDS``]; else None. Params older than 1.3 carry none (None)."""
    if version_of(params) < LEASE_SECONDS_SINCE:
        return None
    value = _number(params.get(REMOTE_LEASE_SECONDS))
    return value if value is not None and 0 < value <= MAX_LEASE_SECONDS else None


def lease_deadline(params: Mapping[str, Any] | None, received_at: float,
                   wall_at_receipt: float | None = None) -> float | None:
    """Until when (on the reader's monotonic clock) prefill holds the params' blocks, at most.

    ``received_at``: the reader's monotonic time when the prefill's response arrived. For 1.3
    params: ``received_at`` + ``remote_lease_seconds``. For older params, which carry a unix
    expiry: converted with the reader's wall clock at receipt (``wall_at_receipt``; None: not
    converted), ``received_at + (expiry - wall_at_receipt)``, so a fleet mid-upgrade still works.
    None when the params carry no usable lease (missing, not a finite number, not positive, more
    than ``MAX_LEASE_SECONDS`` ahead). Raises ``UnsupportedVersion`` for a version this reader
    cannot read."""
    if not params:
        return None
    if version_of(params) >= LEASE_SECONDS_SINCE:
        seconds = lease_seconds(params)
        return None if seconds is None else received_at + seconds
    expiry = _number(params.get(REMOTE_LEASE_EXPIRY))
    if expiry is None or wall_at_receipt is None:
        return None
    left = expiry - wall_at_receipt
    return received_at + left if left <= MAX_LEASE_SECONDS else None


def release_answer(params: Any) -> bool | None:
    """What a prefill's reply to a release request says (lenient, for the router): True, it accepted;
    False, it refused (``ERROR_KEY``); None, not understood (no params object, or an engine that
    knows no release)."""
    if not isinstance(params, Mapping):
        return None
    if params.get(RELEASE_KEY) is True:
        return True
    return False if ERROR_KEY in params else None


# -- strict reads, for decode ---------------------------------------------------------------------
# kv_transfer_params arrive in the client's request body, so a decode server can see any value at
# all: every key it acts on is checked here, before anything reaches a worker (a request refused is
# computed locally, never a crash).

# Block ids index a local cache; anything past this is nonsense whatever the cache size. Lower case,
# like lease_id_bytes: plain numbers elsewhere are not these values (test_contract_spelled_once).
max_block_id = 2**31 - 1
# Refused params carrying more block ids than this are not checked for a release (no HMAC over a
# million ids: the work to refuse must stay small).
max_release_block_ids = 65536
_HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*$")
# The signature check, given by the reader that holds the fleet key (connector/adapter/signed_params.py:
# ``verifier``): raises ``InvalidTransferParams`` (field ``SIG_KEY``) unless the params are signed.
Verify = Callable[[Mapping[str, Any]], None]


class InvalidTransferParams(ValueError):
    """kv_transfer_params of one request are unusable; the message names the field."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"kv_transfer_params.{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class RemotePrefill:
    """A validated decode-side request: where its prompt's KV lives and which blocks (fields named
    as the keys they come from)."""

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


def _root(params: Any) -> Mapping[str, Any]:
    if not isinstance(params, Mapping):
        raise InvalidTransferParams("(root)", f"must be a JSON object, got {type(params).__name__}")
    return params


def wants_remote_prefill(params: Any) -> bool:
    """True when a request asks to pull its prompt KV (do_remote_prefill is true).

    A non-bool flag raises ``InvalidTransferParams``; a non-dict params object too.
    """
    return params is not None and _flag(_root(params), DO_REMOTE_PREFILL)


def wants_remote_decode(params: Any) -> bool:
    """True when a prefill request must keep its blocks for a remote decode."""
    return params is not None and _flag(_root(params), DO_REMOTE_DECODE)


def _version(params: Mapping[str, Any]) -> tuple[int, int]:
    try:
        return version_of(params)
    except UnsupportedVersion as exc:
        raise InvalidTransferParams(exc.field, exc.problem) from None


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
    host = _str(params, REMOTE_HOST)
    assert host is not None
    return _check_host(host, REMOTE_HOST)


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
    raw = params.get(REMOTE_HOSTS)
    if raw is None:
        return ()
    if not isinstance(raw, (list, tuple)) or not raw:
        raise InvalidTransferParams(REMOTE_HOSTS, f"must be a non-empty list of hosts, got {raw!r}")
    if tp_size % len(raw) != 0:
        raise InvalidTransferParams(
            REMOTE_HOSTS, f"has {len(raw)} hosts; the prefill's {tp_size} ranks must spread evenly over them")
    out = []
    for pos, host in enumerate(raw):
        field = f"{REMOTE_HOSTS}[{pos}]"
        if not isinstance(host, str) or not host or len(host) > MAX_ID_LEN:
            raise InvalidTransferParams(field, f"must be a non-empty string of at most {MAX_ID_LEN} characters,"
                                               f" got {host!r}")
        out.append(_check_host(host, field))
    return tuple(out)


def _block_ids(params: Mapping[str, Any], most: int) -> tuple[int, ...]:
    raw = params.get(REMOTE_BLOCK_IDS)
    if raw is None:
        raise InvalidTransferParams(REMOTE_BLOCK_IDS, "is required (a list of block ids, or a list of one such list)")
    if not isinstance(raw, (list, tuple)):
        raise InvalidTransferParams(REMOTE_BLOCK_IDS, f"must be a list, got {type(raw).__name__}")
    # vLLM returns one list per KV-cache group; pdfleet supports exactly one group.
    if raw and all(isinstance(g, (list, tuple)) for g in raw):
        if len(raw) != 1:
            raise InvalidTransferParams(REMOTE_BLOCK_IDS, f"has {len(raw)} KV-cache groups; exactly one is supported")
        raw = raw[0]
    if len(raw) > most:  # before looking at any element: the work stays bounded by the prompt
        raise InvalidTransferParams(REMOTE_BLOCK_IDS, f"has {len(raw)} ids but the prompt spans at most {most}")
    out: list[int] = []
    for pos, value in enumerate(raw):
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidTransferParams(
                f"{REMOTE_BLOCK_IDS}[{pos}]", f"must be an integer, got {type(value).__name__} {value!r}")
        if not 0 <= value <= max_block_id:
            raise InvalidTransferParams(f"{REMOTE_BLOCK_IDS}[{pos}]", f"must be in [0, {max_block_id}], got {value}")
        out.append(value)
    if len(set(out)) != len(out):
        raise InvalidTransferParams(REMOTE_BLOCK_IDS, "contains duplicate block ids")
    return tuple(out)


def _expiry(params: Mapping[str, Any]) -> float | None:
    value = params.get(REMOTE_LEASE_EXPIRY)
    if value is None:
        return None
    number = _number(value)  # never raises: 10**400 is no float
    if number is None:
        raise InvalidTransferParams(REMOTE_LEASE_EXPIRY, f"must be a finite unix time (number), got {_short(value)}")
    return number


def _lease_seconds(params: Mapping[str, Any]) -> float | None:
    value = params.get(REMOTE_LEASE_SECONDS)
    if value is None:
        return None
    allowed = f"a number of seconds in (0, {MAX_LEASE_SECONDS:g}]"
    number = _number(value)  # never raises: 10**400 is no float
    if number is None:
        raise InvalidTransferParams(REMOTE_LEASE_SECONDS, f"must be {allowed}, got {_short(value)}")
    if not 0 < number <= MAX_LEASE_SECONDS:
        raise InvalidTransferParams(REMOTE_LEASE_SECONDS, f"must be {allowed}, got {number:.6g}")
    return number


def _short(value: Any) -> str:
    """A value for an error message, bounded (a 400-digit integer is not echoed whole)."""
    text = repr(value) if not isinstance(value, int) or isinstance(value, bool) or abs(value) < 10**30 else (
        f"an integer of {len(str(abs(value)))} digits")
    return text if len(text) <= 80 else text[:77] + "..."


def _lease_id(params: Mapping[str, Any]) -> bytes:
    lease_id = lease_id_of(params)
    if lease_id is None:
        raise InvalidTransferParams(REMOTE_LEASE_ID, f"is required in params of version"
                                                     f" {version_string(LEASE_ID_SINCE)} or newer:"
                                                     f" {2 * lease_id_bytes} lowercase hex characters,"
                                                     f" got {_short(params.get(REMOTE_LEASE_ID))}")
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


def _holder(params: Mapping[str, Any], local_tp_size: int, *, holder: str, reader: str
            ) -> tuple[str, str, str, int, int, tuple[str, ...], str | None]:
    """Where the held blocks are (engine id, request id, host, port, tp_size, hosts, instance id), read for a
    ``reader`` pulling from a ``holder``: its TP must divide the reader's, one instance id per holder rank."""
    engine_id = _str(params, REMOTE_ENGINE_ID)
    request_id = _str(params, REMOTE_REQUEST_ID)
    host = _host(params)
    port = _int(params, REMOTE_PORT, 1, 65535)
    tp_size = _int(params, TP_SIZE, 1, 1024, default=1)
    if local_tp_size % tp_size != 0:
        raise InvalidTransferParams(TP_SIZE, f"{holder} tp_size {tp_size} must divide {reader} tp_size"
                                             f" {local_tp_size} ({reader} TP = k x {holder} TP)")
    hosts = _hosts(params, tp_size)
    instance_id = _str(params, REMOTE_INSTANCE_ID, required=False)
    if instance_id is not None and len(instance_id.split(",")) != tp_size:
        raise InvalidTransferParams(
            REMOTE_INSTANCE_ID, f"must list one instance id per {holder} rank ({tp_size}), comma-separated")
    assert engine_id is not None and request_id is not None
    return engine_id, request_id, host, port, tp_size, hosts, instance_id


def parse_remote_prefill(
    params: Any,
    *,
    num_prompt_tokens: int,
    block_size: int,
    local_tp_size: int,
    now: float,
    verify: Verify | None = None,
    accepted_at: float | None = None,
) -> RemotePrefill:
    """Validate a do_remote_prefill request's params; raise ``InvalidTransferParams``.

    Checks the schema version (a newer major one is refused), types and ranges of every key, that
    ``remote_block_ids`` covers the blocks this decode will pull (at least the prompt's full blocks,
    at most one per started block plus one), that decode TP is a multiple of prefill ``tp_size``, and
    the lease: for 1.3 params a duration in (0, ``MAX_LEASE_SECONDS``], which with ``accepted_at``
    (this host's monotonic time when the params arrived) gives ``lease_deadline``; for older params a
    unix expiry that has not passed by ``now`` (this host's wall clock) nor lies absurdly far ahead.
    1.4 params must carry ``remote_lease_id``. Last, with ``verify`` (this decode has a fleet key),
    the params must carry a valid ``pdfleet_signature``.
    """
    if not wants_remote_prefill(params):
        raise InvalidTransferParams(DO_REMOTE_PREFILL, "must be true for a remote prefill")
    assert isinstance(params, Mapping)
    version = _version(params)
    if _flag(params, DO_REMOTE_DECODE):
        raise InvalidTransferParams(DO_REMOTE_DECODE, "cannot be true together with do_remote_prefill")
    engine_id, request_id, host, port, tp_size, hosts, instance_id = _holder(params, local_tp_size,
                                                                             holder="prefill", reader="decode")
    remote_num_tokens = params.get(REMOTE_NUM_TOKENS)
    if remote_num_tokens is not None:
        _int(params, REMOTE_NUM_TOKENS, 0, 2**31 - 1)
        if remote_num_tokens < num_tokens_to_pull(num_prompt_tokens, block_size):
            raise InvalidTransferParams(
                REMOTE_NUM_TOKENS,
                f"prefill computed {remote_num_tokens} tokens, fewer than the {num_prompt_tokens}-token prompt"
                " needs (was the prompt changed between the two legs?)",
            )
    need = num_tokens_to_pull(num_prompt_tokens, block_size) // block_size
    most = -(-num_prompt_tokens // block_size) + 1
    block_ids = _block_ids(params, most)
    if len(block_ids) < need:
        raise InvalidTransferParams(
            REMOTE_BLOCK_IDS,
            f"has {len(block_ids)} ids but the {num_prompt_tokens}-token prompt needs at least {need}"
            f" (one per full block of {block_size} tokens)",
        )
    expiry = seconds = deadline = lease_id = None
    if version >= LEASE_ID_SINCE:
        lease_id = _lease_id(params)
    if version >= LEASE_SECONDS_SINCE:
        seconds = _lease_seconds(params)  # a duration: no clock of another host is read
        if seconds is not None and accepted_at is not None:
            deadline = accepted_at + seconds
    else:
        expiry = _expiry(params)
    if expiry is not None and expiry <= now:
        raise InvalidTransferParams(REMOTE_LEASE_EXPIRY, f"the prefill lease expired {now - expiry:.1f}s ago")
    if expiry is not None and expiry > now + MAX_LEASE_SECONDS:
        raise InvalidTransferParams(REMOTE_LEASE_EXPIRY, f"is {expiry - now:.3g}s ahead; at most"
                                                         f" {MAX_LEASE_SECONDS:g}s are allowed")
    if verify is not None:
        verify(params)
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


def _few_block_ids(params: Mapping[str, Any]) -> bool:
    """Whether the block ids are few enough to be worth a signature check (at most
    ``max_release_block_ids`` lists, at most as many ids in them)."""
    raw = params.get(REMOTE_BLOCK_IDS)
    return isinstance(raw, (list, tuple)) and len(raw) <= max_release_block_ids and sum(
        len(g) for g in raw if isinstance(g, (list, tuple))) <= max_release_block_ids


def release_target(params: Any, verify: Verify | None) -> tuple[str, int, int, str, tuple[str, ...]] | None:
    """(host, port, tp_size, remote request id, hosts) of refused params a release may be sent to: only
    when a fleet key signed them (``verify``; never dial a host a client named), and only when they
    are well formed."""
    if verify is None or not isinstance(params, Mapping):
        return None
    raw = params.get(REMOTE_BLOCK_IDS)
    if not _few_block_ids(params) or sum(1 for g in raw if isinstance(g, (list, tuple))) > 1:
        return None
    try:
        verify(params)
        tp = _int(params, TP_SIZE, 1, 1024, default=1)
        request_id = _str(params, REMOTE_REQUEST_ID)
        assert request_id is not None
        return _host(params), _int(params, REMOTE_PORT, 1, 65535), tp, request_id, _hosts(params, tp)
    except InvalidTransferParams:
        return None


def own_lease_to_release(params: Any, *, engine_id: str, verify: Verify | None) -> str:
    """The request id of this prefill's own lease that a release request (``RELEASE_KEY``, sent by the
    router when no decode will read it) names; raise ``InvalidTransferParams`` naming the field.

    Only the engine that produced the params acts on them (``remote_engine_id`` is its own), and with
    a fleet key (``verify``) only on params it signed itself, so a client can release nothing it was
    not handed. What the release may free is bounded further by the lease table: only a lease no
    reader claimed."""
    params = _root(params)
    _version(params)
    engine = _str(params, REMOTE_ENGINE_ID)
    if engine != engine_id:
        raise InvalidTransferParams(REMOTE_ENGINE_ID, f"names engine {engine!r}, not this prefill ({engine_id!r}):"
                                                      " a prefill releases only its own leases")
    request_id = _str(params, REMOTE_REQUEST_ID)
    assert request_id is not None
    if verify is not None:
        if not _few_block_ids(params):
            raise InvalidTransferParams(REMOTE_BLOCK_IDS, "must be the list this prefill returned")
        verify(params)
    return request_id


# -- decode's KV reused by the next turn's prefill (issue 40, part 3) ----------------------------
# Request keys, not produced ones (no version change). The router marks a P/D decode leg with
# ``HOLD_FOR_NEXT_TURN`` (unsigned: it only asks); a decode that is also a KV producer (kv_both) then
# holds the finished request's full blocks, prompt and generated tokens, under a lease like a prefill
# hold and returns ``produce`` params plus ``REUSE_BLOCK_HASHES`` (vLLM's prefix-caching hash of each
# held block, hex) signed a second time with ``REUSE_SIG_KEY``. The router hands them, under
# ``REUSE_KEY``, to the prefill of the conversation's next turn, with ``REUSE_MIN_TOKENS``; the prefill
# pulls the longest prefix of held blocks whose hashes match its own prompt's (``parse_reuse``).
HOLD_FOR_NEXT_TURN = "pdfleet_hold_for_next_turn"
REUSE_KEY = "pdfleet_reuse"
REUSE_MIN_TOKENS = "pdfleet_reuse_min_tokens"
REUSE_BLOCK_HASHES = "pdfleet_block_hashes"
REUSE_SIG_KEY = "pdfleet_reuse_signature"
# What the reuse signature covers: everything the v3 signature does, and the block hashes.
SIGNED_REUSE_FIELDS = SIGNED_FIELDS_V3 + (REUSE_BLOCK_HASHES,)
# A block hash is a digest: vLLM's are 32 bytes (sha256, sha256_cbor) or 8/16 (xxhash); at most 64.
max_block_hash_bytes = 64
# A reuse offer names at most this many blocks (a decode's whole turn; more is refused unread).
max_reuse_blocks = 65536
_BLOCK_HASH = re.compile(r"^(?:[0-9a-f]{2}){1,64}$")


def wants_hold_for_next_turn(params: Any) -> bool:
    """True when the router asks a decode to keep the finished request's blocks for the next turn
    (lenient: anything but ``true`` is no)."""
    return isinstance(params, Mapping) and params.get(HOLD_FOR_NEXT_TURN) is True


def hold_for_next_turn(params: Mapping[str, Any]) -> dict[str, Any]:
    """Decode's kv_transfer_params with the router's ask to hold the turn's blocks (unsigned key)."""
    return dict(params) | {HOLD_FOR_NEXT_TURN: True}


def with_block_hashes(params: Mapping[str, Any], block_hashes: list[bytes]) -> dict[str, Any]:
    """Decode's produced params for a hold kept for the next turn: the hash of each held block, hex."""
    return dict(params) | {REUSE_BLOCK_HASHES: [bytes(h).hex() for h in block_hashes]}


def reuse_offer(params: Any) -> bool:
    """Lenient, for the router: whether a decode's answer params offer its blocks to the next turn."""
    return (isinstance(params, Mapping) and params.get(DO_REMOTE_PREFILL) is True
            and isinstance(params.get(REUSE_BLOCK_HASHES), list))


def reuse_offer_tokens(params: Any, block_size: int) -> int:
    """Lenient, for the router: tokens a reuse offer holds (full blocks x block size; 0 if unusable)."""
    if not reuse_offer(params) or block_size <= 0:
        return 0
    return len(params[REUSE_BLOCK_HASHES]) * block_size


def reuse_request(offer: Mapping[str, Any], min_tokens: int) -> dict[str, Any]:
    """The keys the router adds to the next turn's prefill request beside ``do_remote_decode``."""
    return {REUSE_KEY: dict(offer), REUSE_MIN_TOKENS: int(min_tokens)}


@dataclass(frozen=True)
class Reuse:
    """A validated reuse offer on a prefill request: where the held blocks are (``remote``, read like a
    remote prefill's), the hash of each held block, and the router's threshold."""

    remote: RemotePrefill
    block_hashes: tuple[bytes, ...]
    min_tokens: int


def has_reuse(params: Any) -> bool:
    return isinstance(params, Mapping) and params.get(REUSE_KEY) is not None


def _block_hashes(params: Mapping[str, Any], count: int) -> tuple[bytes, ...]:
    raw = params.get(REUSE_BLOCK_HASHES)
    if not isinstance(raw, (list, tuple)):
        raise InvalidTransferParams(REUSE_BLOCK_HASHES, f"must be a list of hex strings, got {type(raw).__name__}")
    if len(raw) != count:  # before looking at any element
        raise InvalidTransferParams(REUSE_BLOCK_HASHES, f"has {len(raw)} hashes for {count} held blocks;"
                                                        " exactly one per block is required")
    out = []
    for pos, value in enumerate(raw):
        if not isinstance(value, str) or not _BLOCK_HASH.match(value):
            raise InvalidTransferParams(f"{REUSE_BLOCK_HASHES}[{pos}]", f"must be 2 to {2 * max_block_hash_bytes}"
                                                                       f" lowercase hex characters, got {_short(value)}")
        out.append(bytes.fromhex(value))
    return tuple(out)


def parse_reuse(
    params: Any,
    *,
    local_tp_size: int,
    verify: Verify | None = None,
    verify_reuse: Verify | None = None,
    accepted_at: float | None = None,
) -> Reuse:
    """Validate the reuse offer a prefill request carries (``REUSE_KEY``); raise ``InvalidTransferParams``
    naming the field. The offer is a decode's produced params of this version (1.4: a lease id, a lease
    duration) plus one block hash per held block; with ``verify`` / ``verify_reuse`` (a fleet key) both
    signatures must hold, so that a client can neither point a prefill at a host of its choosing nor
    swap which tokens the blocks are said to hold."""
    params = _root(params)
    offer = params.get(REUSE_KEY)
    if not isinstance(offer, Mapping):
        raise InvalidTransferParams(REUSE_KEY, f"must be a JSON object (a decode's offer), got {type(offer).__name__}")
    min_tokens = _int(params, REUSE_MIN_TOKENS, 0, 2**31 - 1, default=0)
    if not _flag(offer, DO_REMOTE_PREFILL) or _flag(offer, DO_REMOTE_DECODE):
        raise InvalidTransferParams(f"{REUSE_KEY}.{DO_REMOTE_PREFILL}", "must be true (and do_remote_decode false)")
    if _version(offer) < LEASE_ID_SINCE:
        raise InvalidTransferParams(f"{REUSE_KEY}.{VERSION_KEY}", f"must be {version_string(LEASE_ID_SINCE)} or"
                                                                  " newer (decodes that offer blocks write it)")
    try:
        engine_id, request_id, host, port, tp_size, hosts, instance_id = _holder(offer, local_tp_size,
                                                                                 holder="decode", reader="prefill")
        block_ids = _block_ids(offer, max_reuse_blocks)
        hashes = _block_hashes(offer, len(block_ids))
        lease_id = _lease_id(offer)
        seconds = _lease_seconds(offer)
        if verify is not None:
            verify(offer)
        if verify_reuse is not None:
            verify_reuse(offer)
    except InvalidTransferParams as exc:  # name the field under the offer
        raise InvalidTransferParams(f"{REUSE_KEY}.{exc.field}", exc.problem) from None
    assert engine_id is not None and request_id is not None
    remote = RemotePrefill(
        remote_engine_id=engine_id, remote_request_id=request_id, remote_host=host, remote_port=port,
        remote_block_ids=block_ids, tp_size=tp_size, remote_instance_id=instance_id, remote_hosts=hosts,
        remote_lease_seconds=seconds, remote_lease_id=lease_id,
        lease_deadline=None if seconds is None or accepted_at is None else accepted_at + seconds)
    return Reuse(remote, hashes, min_tokens)


def reuse_release_target(params: Any, verify: Verify | None) -> tuple[str, int, int, str, tuple[str, ...]] | None:
    """Where to send the release of a refused or unused reuse offer (``release_target`` on the offer)."""
    offer = params.get(REUSE_KEY) if isinstance(params, Mapping) else None
    return release_target(offer, verify)


# -- keeping a decode's hold for the next turn alive (issue 40, part 3) ---------------------------
# A request key, not a produced one (no version change). Between turns the router keeps each offer it
# holds alive: a one-token completion to the decode that made them, whose kv_transfer_params carry
# ``KEEP_ALIVE_KEY``: a list of offers as that decode signed them (at most ``max_keep_alive_offers``).
# The decode extends each hold that is its own and that it still has by its lease length from now; it
# answers one verdict per offer, in order, under the same key: ``KEPT`` or why not. A hold still ends
# when the decode needs the memory (its oldest holds first) or when nobody keeps it alive.
KEEP_ALIVE_KEY = "pdfleet_keep_alive"
KEPT = "kept"
# Offers per keep-alive request: the decode checks one signature per offer (lower case on purpose, as
# lease_id_bytes: the plain number elsewhere is not this value).
max_keep_alive_offers = 64
# What a keep-alive needs of an offer: what the v3 signature covers (the block hashes and their own
# signature are for the prefill that pulls; not sent).
_KEEP_ALIVE_FIELDS = SIGNED_FIELDS_V3 + (SIG_KEY, DO_REMOTE_PREFILL, DO_REMOTE_DECODE)


def keep_alive_request(offers: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The kv_transfer_params of a keep-alive request for ``offers`` (one decode's, at most
    ``max_keep_alive_offers``): each offer's signed keys, as the decode returned them."""
    if not 0 < len(offers) <= max_keep_alive_offers:
        raise ValueError(f"a keep-alive names 1 to {max_keep_alive_offers} offers, got {len(offers)}")
    return {KEEP_ALIVE_KEY: [{k: o[k] for k in _KEEP_ALIVE_FIELDS if k in o} for o in offers]}


def wants_keep_alive(params: Any) -> bool:
    return isinstance(params, Mapping) and params.get(KEEP_ALIVE_KEY) is not None


def keep_alive_offers(params: Any) -> list[Any]:
    """The offers a keep-alive request names (strict, for decode): a list of 1 to
    ``max_keep_alive_offers``; raise ``InvalidTransferParams`` naming the field."""
    raw = _root(params).get(KEEP_ALIVE_KEY)
    if not isinstance(raw, list) or not 0 < len(raw) <= max_keep_alive_offers:
        raise InvalidTransferParams(KEEP_ALIVE_KEY, f"must be a list of 1 to {max_keep_alive_offers} offers, got"
                                                    f" {_short(raw) if not isinstance(raw, list) else len(raw)}")
    return raw


def own_held_offer(offer: Any, *, engine_id: str, verify: Verify | None, index: int = 0) -> tuple[str, bytes]:
    """(request id, lease id) of a hold that a keep-alive's offer ``index`` names, if the offer is this
    decode's own (``remote_engine_id``; with a fleet key, its signature); raise ``InvalidTransferParams``
    naming the field. Whether the hold is still held is the decode's table to say."""
    where = f"{KEEP_ALIVE_KEY}[{index}]"
    try:
        if not isinstance(offer, Mapping):
            raise InvalidTransferParams("", f"must be a JSON object (a decode's offer), got {type(offer).__name__}")
        if _version(offer) < LEASE_ID_SINCE:
            raise InvalidTransferParams(VERSION_KEY, f"must be {version_string(LEASE_ID_SINCE)} or newer")
        engine = _str(offer, REMOTE_ENGINE_ID)
        if engine != engine_id:
            raise InvalidTransferParams(REMOTE_ENGINE_ID, f"names engine {_short(engine)}, not this decode"
                                                          f" ({engine_id!r}): a decode keeps only its own holds")
        request_id = _str(offer, REMOTE_REQUEST_ID)
        lease_id = _lease_id(offer)
        if verify is not None:
            _block_ids(offer, max_reuse_blocks)  # bounded before the signature is computed over them
            verify(offer)
    except InvalidTransferParams as exc:
        raise InvalidTransferParams(f"{where}.{exc.field}" if exc.field else where, exc.problem) from None
    assert request_id is not None and lease_id is not None
    return request_id, lease_id


def keep_alive_reply(verdicts: list[str]) -> dict[str, Any]:
    """What a decode returns for a keep-alive request: one verdict per offer, ``KEPT`` or why not."""
    return {KEEP_ALIVE_KEY: list(verdicts)}


def keep_alive_answer(params: Any, count: int) -> list[bool] | None:
    """What a decode's reply to a keep-alive of ``count`` offers says (lenient, for the router): per offer,
    True kept, False refused; None when not understood (an engine without keep-alives, or not one
    verdict per offer)."""
    raw = params.get(KEEP_ALIVE_KEY) if isinstance(params, Mapping) else None
    if not isinstance(raw, list) or len(raw) != count or not all(isinstance(v, str) for v in raw):
        return None
    return [v == KEPT for v in raw]
