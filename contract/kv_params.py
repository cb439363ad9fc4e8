"""``kv_transfer_params``: one versioned schema that the connector writes and the router reads.

A prefill engine returns these params in its response (``produce``); the router forwards them
to decode unchanged and reads one thing itself, the lease, to decide whether a decode retry may
reuse prefill's KV (``lease_deadline``, on the router's monotonic clock); decode's connector
validates every key (connector/adapter/params.py: ``parse_remote_prefill``).

Key names follow vLLM's NixlConnector (``do_remote_prefill``, ``do_remote_decode``,
``remote_block_ids``, ``remote_engine_id``, ``remote_request_id``, ``remote_host``,
``remote_port``, ``tp_size``, ``remote_num_tokens``) plus pdfleet's ``remote_instance_id``
(restart detection), ``remote_lease_seconds`` (1.3: for how many seconds, counted from when the
prefill returned the params, it holds the blocks), ``remote_lease_expiry`` (up to 1.2: the unix
time until which it holds them) and ``remote_hosts`` (one side-channel host per node of a
multi-node prefill).

Versions (``pdfleet_params_version``, "MAJOR.MINOR"):

- 1.0: what engines wrote before this schema had a version; they write no version key, and
  a reader takes a missing key as 1.0. Same keys as 1.1.
- 1.1: adds the version key itself.
- 1.2: adds ``pdfleet_signature``, the prefill's HMAC with the fleet key over the keys decode acts
  on (``SIGNED_FIELDS``; connector/adapter/params.py signs and verifies). A decode with a fleet
  key refuses params without a valid one, so during a rolling upgrade a new decode recomputes
  the prompts of prefills that do not sign yet.
- 1.3: the lease is a duration, ``remote_lease_seconds``, not a wall-clock instant: no reader
  compares another host's clock with its own any more (an NTP step on either side cannot make a
  lease look expired or alive). A reader adds the seconds to its own monotonic time of receipt,
  which gives an *upper* bound of the lease (the params were on the way for a while): the router
  decides reuse with it (within ``--lease-margin-s``), decode starts its READ and bounds its
  heartbeat retries with it; a pull still completes only on the source's ack. A 1.3
  prefill no longer writes ``remote_lease_expiry`` (it was always optional). The signature
  becomes ``v2`` over ``SIGNED_FIELDS_V2`` (``SIGNED_FIELDS_V1`` plus ``remote_lease_seconds`` and
  the version key itself, so that neither the duration nor the version can be changed); a verifier
  still accepts ``v1`` over ``SIGNED_FIELDS_V1``, but only on params of version 1.2 or older,
  which are then read the 1.2 way (the wall-clock expiry; ``remote_lease_seconds`` is ignored).

  Rolling upgrade. 1.2 prefill + 1.3 decode/router: the 1.3 readers read 1.2 params as before
  (decode checks the wall-clock expiry and verifies ``v1``; the router converts the expiry with
  its wall clock at receipt). 1.3 prefill + 1.2 router: the old router finds no expiry and does
  not reuse the KV on a decode retry (the retry recomputes: the safe default). 1.3 prefill + 1.2
  decode: a decode without a fleet key pulls as before (the old reader ignores the new key and has
  no expiry to check); a decode with a key refuses the ``v2`` signature and recomputes the prompt
  (correct output, no KV transfer; the prefill frees the blocks at lease expiry). So upgrade
  decodes and routers before prefills, as for 1.2.

- 1.4: single-use leases. Each hold gets a random lease id (16 bytes from ``secrets``), carried as
  ``remote_lease_id`` (32 lowercase hex characters) and signed: the signature becomes ``v3`` over
  ``SIGNED_FIELDS_V3`` (v2's fields plus the lease id). Decode names the lease id in every heartbeat,
  release and completion notification; the source refuses (and counts) any that names a held lease
  without its id, and remembers spent ids (completed, released, expired), which never confirm or start
  another pull. A 1.4 decode posts a 1.4 pull's READs only after the source's ack for that lease id
  (a fresh grant; no READ on the duration alone, which a replay of old params also carries), and takes
  no ``released_by_you`` for one. A verifier accepts ``v2`` only on params of 1.3 or older.

  Rolling upgrade. 1.3 prefill + 1.4 decode/router: the 1.4 decode reads 1.3 params the 1.3 way
  (no lease id in its messages, READ on the lease bound; the replay defence needs 1.4 prefills); the
  router reads the duration as before. 1.4 prefill + 1.3 router: the router reads the duration (a
  minor version; it ignores the lease id) and sends releases with the params as signed, which the
  prefill checks. 1.4 prefill + 1.3 decode: a decode with a fleet key refuses the ``v3`` signature and
  recomputes (the router's release or the lease's end frees the blocks); a decode without a key pulls
  the 1.3 way, its id-less heartbeats are answered "gone" and its notification refused, so it
  recomputes too (correct output, no KV transfer; the lease runs its course). So upgrade decodes
  and routers before prefills, as for 1.2 and 1.3.

A minor version only adds optional keys (1.3 also stops writing one), so a reader of 1.x reads
any 1.y. A reader refuses a newer major version (``UnsupportedVersion``, naming both). Readers
that check no signature (the router, decodes without a key) ignore ``pdfleet_signature``.
"""

from __future__ import annotations

import math
import re
import secrets
from typing import Any, Mapping

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
