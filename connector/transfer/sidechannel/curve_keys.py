"""CURVE keys of the side channel, and the ZAP check that admits only fleet members.

A client's CURVE key pair derives from the fleet key (HMAC), so the server's ZAP handler
admits a connection only if its public key derives from a key the ring accepts; a peer
without the key never gets past the ZMTP handshake. The CURVE server key is a published
constant: CURVE here keeps keyless peers out; the HMAC of every message (auth.py) is what
authenticates the payload both ways.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Callable

import zmq
from zmq.utils import z85

from pdfleet.connector.transfer import auth, wire

__all__ = ["ZAP_DOMAIN", "CURVE_SERVER_SECRET", "CURVE_SERVER_PUBLIC", "curve_client_keys", "secure_client_socket",
           "FleetClients"]

ZAP_DOMAIN = "pdfleet-side-channel"
CURVE_SERVER_SECRET = z85.encode(hashlib.sha256(b"pdfleet-side-channel-curve-server-v1").digest())
CURVE_SERVER_PUBLIC = zmq.curve_public(CURVE_SERVER_SECRET)


def curve_client_keys(key: bytes) -> tuple[bytes, bytes]:
    """(public, secret) CURVE keys (Z85) of a side-channel client holding fleet key ``key``."""
    secret = z85.encode(hmac.new(key, b"pdfleet-side-channel-curve-client-v1", hashlib.sha256).digest())
    return zmq.curve_public(secret), secret


def secure_client_socket(ctx: zmq.Context, secret: "bytes | auth.KeyRing | None", kind: int = zmq.DEALER) -> zmq.Socket:
    """A socket that can talk to a ``SideChannelServer`` with this secret (CURVE set up when keyed)."""
    sock = ctx.socket(kind)
    ring = wire.key_ring(secret)
    if ring is not None:
        public, private = curve_client_keys(ring.current)
        sock.curve_serverkey = CURVE_SERVER_PUBLIC
        sock.curve_publickey = public
        sock.curve_secretkey = private
    return sock


class FleetClients:
    """ZAP credentials check: a CURVE client key derived from a fleet key the ring accepts."""

    def __init__(self, ring: auth.KeyRing, on_refuse: Callable[[str, str], None]) -> None:
        self._ring = ring
        self._on_refuse = on_refuse
        self._derived: dict[bytes, bytes] = {}

    def _publics(self, refresh: bool) -> set[bytes]:
        out = set()
        for key in self._ring.accepted_keys(refresh=refresh):
            pub = self._derived.get(key)
            if pub is None:
                if len(self._derived) > 64:
                    self._derived.clear()
                pub = self._derived[key] = curve_client_keys(key)[0]
            out.add(pub)
        return out

    def callback(self, domain: str, key: bytes) -> bool:
        if key in self._publics(False) or key in self._publics(True):
            return True
        self._on_refuse("a client whose CURVE key derives from no accepted fleet key (no key, or a wrong one)",
                        "unknown_peer_key")
        return False
