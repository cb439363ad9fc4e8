"""The Endpoint Picker's TLS (secure serving, as GAIE's reference EPP has it): which port serves what, and the
certificate.

The gateways that dial an InferencePool's picker over TLS (Envoy AI Gateway, agentgateway) verify nothing, so a
self-signed certificate made at start serves them as well as a CA's; ``--cert-path`` serves a given one (a
kubernetes.io/tls Secret mounted as a folder). TLS without verification hides what crosses the wire (the caller
token, the engine token, kv_transfer_params) from a sniffer, not from an impostor that takes the EPP's address:
the caller token (caller_auth.py) and the NetworkPolicy guard that (docs/gateway.md).

Pure: ``listeners`` (what to serve on which port), ``alt_names`` (the certificate's SANs), ``self_signed`` (given
the clock and the key). The I/O edge: ``load`` (the folder) and ``server_credentials``.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from pdfleet.contract.gateway import CERT_PATH_FLAG, TLS_CERT_FILE, TLS_KEY_FILE

EXT_PROC = "ext_proc"  # what a listener serves: the ext_proc stream (behind the caller check) ...
HEALTH = "health"  # ... and grpc.health.v1
VALIDITY = dt.timedelta(days=365)  # a self-signed certificate lives as long as its pod, well under this
SKEW = dt.timedelta(minutes=5)  # valid from a little before now: a gateway's clock may lag the EPP's
COMMON_NAME = "pdfleet-epp"


class TlsError(ValueError):
    """The EPP's certificate setting is unusable; the message names the flag or the file."""


@dataclass(frozen=True)
class Listener:
    port: int
    tls: bool
    serves: tuple[str, ...]


def listeners(port: int, health_port: int | None, *, secure: bool) -> tuple[Listener, ...]:
    """The gRPC listeners: ext_proc (and health over the same transport) on ``port``, TLS when ``secure``; health
    alone in plaintext on ``health_port`` (None: none), for the kubelet's gRPC probes, which cannot do TLS."""
    if health_port is not None and health_port != 0 and health_port == port:
        raise TlsError(f"the gRPC health port and the ext_proc port must differ (both {port})")
    main = Listener(port, secure, (EXT_PROC, HEALTH))
    return (main,) if health_port is None else (main, Listener(health_port, False, (HEALTH,)))


def alt_names(host: str, hostname: str) -> tuple[tuple[str, str], ...]:
    """The self-signed certificate's SANs as ("ip"|"dns", value): the address it binds (not an unspecified one,
    which no client dials), "localhost" for a loopback bind, and the machine's name (the pod's)."""
    out: list[tuple[str, str]] = []
    try:
        ip = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        ip = None
        if host:
            out.append(("dns", host))
    if ip is not None and not ip.is_unspecified:
        out.append(("ip", str(ip)))
        if ip.is_loopback:
            out.append(("dns", "localhost"))
    if hostname and ("dns", hostname) not in out:
        out.append(("dns", hostname))
    return tuple(out)


def self_signed(names: tuple[tuple[str, str], ...], now: dt.datetime, key=None) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM): ECDSA P-256, valid from ``now`` - SKEW for VALIDITY, for ``names``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = key or ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, COMMON_NAME)])
    sans = [x509.IPAddress(ipaddress.ip_address(v)) if kind == "ip" else x509.DNSName(v) for kind, v in names]
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - SKEW).not_valid_after(now + VALIDITY)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(key, hashes.SHA256())
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def check_pair(cert_pem: bytes, key_pem: bytes, where: str) -> None:
    """A clear error naming ``where`` for a PEM that does not parse or a key that is not the certificate's (gRPC
    would say only that the handshake failed, on the gateway's side)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as exc:
        raise TlsError(f"{where}/{TLS_CERT_FILE} is not a PEM certificate: {exc}") from None
    try:
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise TlsError(f"{where}/{TLS_KEY_FILE} is not an unencrypted PEM private key: {exc}") from None
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if cert.public_key().public_bytes(*fmt) != key.public_key().public_bytes(*fmt):
        raise TlsError(f"{where}/{TLS_KEY_FILE} is not the key of {where}/{TLS_CERT_FILE}")


def load(folder: str) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) from ``folder``/tls.crt and tls.key (the --cert-path folder)."""
    root = Path(folder)
    pair = []
    for name in (TLS_CERT_FILE, TLS_KEY_FILE):
        try:
            pair.append((root / name).read_bytes())
        except OSError as exc:
            raise TlsError(f"{CERT_PATH_FLAG} {folder}: cannot read {name}: {exc.strerror or exc}") from None
    check_pair(pair[0], pair[1], folder)
    return pair[0], pair[1]


def certificate(cert_path: str | None, host: str, hostname: str, now: dt.datetime) -> tuple[bytes, bytes]:
    """The pair to serve: the folder's, else a self-signed one for ``host``."""
    return load(cert_path) if cert_path else self_signed(alt_names(host, hostname), now)


def server_credentials(pair: tuple[bytes, bytes]):
    import grpc

    cert_pem, key_pem = pair
    return grpc.ssl_server_credentials([(key_pem, cert_pem)])
