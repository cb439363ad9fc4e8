"""The fleet key's signature over ``kv_transfer_params`` (issue 19): what a prefill adds, what a keyed
decode checks. Every read of the params is pdfleet.contract.kv_params; this module holds only the
HMAC, which needs the key ring (transfer/auth.py) and msgpack.

With a fleet key, prefill adds ``pdfleet_signature``, an HMAC-SHA256 with the fleet key over every
field decode acts on (``SIGNED_FIELDS``), and decode refuses params without a valid one: a client
that can POST to a decode can then neither point it at a host of its choosing nor swap in another
request's blocks, and the lease it carries is the prefill's.

Signature versions (the contract's version table): a prefill writes ``v3`` over ``SIGNED_FIELDS_V3``
(params 1.4); ``v2`` over ``SIGNED_FIELDS_V2`` (a 1.3 prefill) is accepted on params of version 1.3
or older only, ``v1`` over ``SIGNED_FIELDS_V1`` (a 1.2 prefill) on 1.2 or older only.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from typing import Any, Mapping, Optional

import msgspec

from pdfleet.connector.transfer import auth
from pdfleet.contract import kv_params as K
from pdfleet.contract.kv_params import InvalidTransferParams, Verify

__all__ = ["sign_params", "sign_reuse", "verify_params", "verify_reuse", "verifier", "reuse_verifier"]

# Signature version -> (HMAC domain, fields). A prefill signs with _SIG_VERSION.
_SIG_SCHEMES = {
    "v1": (b"pdfleet-kv-transfer-params-v1", K.SIGNED_FIELDS_V1),
    "v2": (b"pdfleet-kv-transfer-params-v2", K.SIGNED_FIELDS_V2),
    "v3": (b"pdfleet-kv-transfer-params-v3", K.SIGNED_FIELDS_V3),
}
# The newest params version each signature may cover: an older scheme leaves newer keys unsigned.
_SIG_COVERS = {"v1": (1, 2), "v2": (1, 3), "v3": K.VERSION}
_SIG_VERSION = "v3"
# A decode's reuse offer (issue 40): a second signature, under its own key and domain, over the v3 fields
# and the held blocks' hashes; the v3 one stays as it is, so the offer's lease releases like any other.
_REUSE_VERSION = "r1"
_REUSE_SCHEME = (b"pdfleet-kv-reuse-offer-v1", K.SIGNED_REUSE_FIELDS)
# Numbers a JSON encoder may write as integers (30.0 as 30): signed as floats.
_FLOAT_FIELDS = (K.REMOTE_LEASE_EXPIRY, K.REMOTE_LEASE_SECONDS)


def _canonical(params: Mapping[str, Any], version: str = _SIG_VERSION) -> bytes:
    """The signed bytes of signature ``version``: its fields in a fixed order, numbers normalised as
    JSON would carry them."""
    domain, fields = _SIG_SCHEMES[version] if version != _REUSE_VERSION else _REUSE_SCHEME
    values = []
    try:
        for key in fields:
            value = params.get(key)
            if key in _FLOAT_FIELDS and isinstance(value, int) and not isinstance(value, bool):
                value = float(value)  # a JSON encoder may write 1.7e9 as an integer (10**400: OverflowError)
            values.append(value)
        return msgspec.msgpack.encode([domain, values])
    except (TypeError, ValueError, OverflowError) as exc:
        raise InvalidTransferParams(K.SIG_KEY, f"the signed fields cannot be encoded: {exc}") from None


def sign_params(params: Mapping[str, Any], key: bytes, version: str = _SIG_VERSION) -> str:
    """The ``pdfleet_signature`` value for ``params`` under fleet key ``key`` (``version`` "v1": as a
    1.2 prefill signs, for tests of a rolling upgrade)."""
    mac = hmac.new(key, _canonical(params, version), hashlib.sha256).hexdigest()
    return f"{version}.{auth.key_id(key).hex()}.{mac}"


def verify_params(params: Mapping[str, Any], ring: auth.KeyRing) -> None:
    """Raise ``InvalidTransferParams`` (field ``pdfleet_signature``) unless a key of ``ring`` signed ``params``."""
    value = params.get(K.SIG_KEY)
    if value is None:
        raise InvalidTransferParams(K.SIG_KEY, "is required: this decode has a fleet key and pulls only what a"
                                               " prefill of the fleet signed")
    parts = value.split(".") if isinstance(value, str) and len(value) <= 200 else []
    if len(parts) != 3 or parts[0] not in _SIG_SCHEMES:
        raise InvalidTransferParams(K.SIG_KEY, f"must be '{_SIG_VERSION}.<key id>.<hmac>' (hex), or 'v2.…' on"
                                               " params of version 1.3 or older, 'v1.…' on 1.2 or older")
    covers = _SIG_COVERS[parts[0]]
    if covers < K.VERSION:
        try:
            version = K.version_of(params)
        except K.UnsupportedVersion as exc:
            raise InvalidTransferParams(exc.field, exc.problem) from None
        if version > covers:  # an older scheme leaves the newer keys (duration, version, lease id) unsigned
            raise InvalidTransferParams(K.SIG_KEY, f"a {parts[0]} signature covers params of version"
                                                   f" {K.version_string(covers)} or older only; these are"
                                                   f" {params.get(K.VERSION_KEY)}: sign them {_SIG_VERSION}")
    _check_mac(params, parts, ring, K.SIG_KEY, reader="this decode",
               changed="does not match the params (changed after the prefill signed them)")


def _check_mac(params: Mapping[str, Any], parts: list[str], ring: auth.KeyRing, field: str, *, reader: str,
               changed: str) -> None:
    """``parts`` (scheme, key id, hmac; the scheme already checked) sign ``params`` under a key of ``ring``."""
    try:
        kid, mac = bytes.fromhex(parts[1]), bytes.fromhex(parts[2])
    except ValueError:
        raise InvalidTransferParams(field, "key id and hmac must be hex") from None
    key = ring.lookup(kid)
    if key is None:
        raise InvalidTransferParams(field, f"signed with a key {reader} does not accept")
    if not hmac.compare_digest(hmac.new(key, _canonical(params, parts[0]), hashlib.sha256).digest(), mac):
        raise InvalidTransferParams(field, changed)


def verifier(ring: Optional[auth.KeyRing]) -> Verify | None:
    """The contract's ``verify`` for this engine: the signature check under ``ring``; None without a
    fleet key (then the contract's readers check no signature)."""
    return None if ring is None else functools.partial(verify_params, ring=ring)


def sign_reuse(params: Mapping[str, Any], key: bytes) -> str:
    """The ``pdfleet_reuse_signature`` value of a decode's reuse offer."""
    mac = hmac.new(key, _canonical(params, _REUSE_VERSION), hashlib.sha256).hexdigest()
    return f"{_REUSE_VERSION}.{auth.key_id(key).hex()}.{mac}"


def verify_reuse(params: Mapping[str, Any], ring: auth.KeyRing) -> None:
    """Raise ``InvalidTransferParams`` (field ``pdfleet_reuse_signature``) unless a key of ``ring`` signed
    the offer's block hashes with the rest of it."""
    value = params.get(K.REUSE_SIG_KEY)
    parts = value.split(".") if isinstance(value, str) and len(value) <= 200 else []
    if len(parts) != 3 or parts[0] != _REUSE_VERSION:
        raise InvalidTransferParams(K.REUSE_SIG_KEY, f"is required: '{_REUSE_VERSION}.<key id>.<hmac>' (hex)")
    _check_mac(params, parts, ring, K.REUSE_SIG_KEY, reader="this engine",
               changed="does not match the offer (changed after the decode signed it)")


def reuse_verifier(ring: Optional[auth.KeyRing]) -> Verify | None:
    return None if ring is None else functools.partial(verify_reuse, ring=ring)
