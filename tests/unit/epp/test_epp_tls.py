"""Secure serving (connector/epp/tls.py, command.py, envoy_config.py): what each port serves, the self-signed
certificate's names and life, a --cert-path folder checked with errors that name the file, the ports' rules, and
the shipped Envoy configs' epp cluster (TLS verifying nothing, or h2c), which Envoy itself accepts."""

from __future__ import annotations

import datetime as dt
import ipaddress
import subprocess

import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from pdfleet.connector.epp import tls
from pdfleet.connector.epp.command import _port_problem
from pdfleet.connector.epp.envoy_config import BUFFERED, EPP_PLAINTEXT, EPP_TLS, FULL_DUPLEX, render
from pdfleet.connector.epp.envoy_process import envoy_binary
from pdfleet.contract.gateway import CERT_PATH_FLAG, EPP_GRPC, EPP_GRPC_HEALTH, EPP_METRICS

TOKEN = "t" * 64
NOW = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.timezone.utc)
E, H = tls.EXT_PROC, tls.HEALTH


@pytest.mark.parametrize("port, health_port, secure, want", [
    # the cluster's EPP: ext_proc over TLS, health alone in plaintext for the kubelet
    (9002, 9003, True, [(9002, True, (E, H)), (9003, False, (H,))]),
    (9002, 9003, False, [(9002, False, (E, H)), (9003, False, (H,))]),
    # embedded (tests, pdfleet local): no health-only port
    (0, None, False, [(0, False, (E, H))]),
    (0, None, True, [(0, True, (E, H))]),
    (0, 0, True, [(0, True, (E, H)), (0, False, (H,))]),  # two free ports
])
def test_what_each_port_serves(port, health_port, secure, want):
    got = tls.listeners(port, health_port, secure=secure)
    assert [(x.port, x.tls, x.serves) for x in got] == want
    assert all(E not in x.serves for x in got if not x.tls and secure)  # never ext_proc in plaintext when secure


def test_the_health_port_cannot_be_the_ext_proc_port():
    with pytest.raises(tls.TlsError, match="must differ"):
        tls.listeners(9002, 9002, secure=True)


@pytest.mark.parametrize("host, hostname, want", [
    ("10.1.2.3", "epp-abc", (("ip", "10.1.2.3"), ("dns", "epp-abc"))),  # the pod IP and the pod's name
    ("fd00::7", "epp-abc", (("ip", "fd00::7"), ("dns", "epp-abc"))),
    ("[fd00::7]", "", (("ip", "fd00::7"),)),
    ("127.0.0.1", "box", (("ip", "127.0.0.1"), ("dns", "localhost"), ("dns", "box"))),
    ("0.0.0.0", "box", (("dns", "box"),)),  # no client dials an unspecified address
    ("::", "", ()),
    ("epp.example", "epp.example", (("dns", "epp.example"),)),  # a name once
])
def test_alt_names(host, hostname, want):
    assert tls.alt_names(host, hostname) == want


def test_self_signed_is_p256_short_lived_and_names_the_pod():
    cert_pem, key_pem = tls.self_signed(tls.alt_names("10.1.2.3", "epp-abc"), NOW)
    cert = x509.load_pem_x509_certificate(cert_pem)
    assert isinstance(cert.public_key().curve, ec.SECP256R1)
    assert cert.not_valid_before_utc == NOW - tls.SKEW and cert.not_valid_after_utc == NOW + dt.timedelta(days=365)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.1.2.3")]
    assert san.get_values_for_type(x509.DNSName) == ["epp-abc"]
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    tls.check_pair(cert_pem, key_pem, "made")  # its key is its own
    assert tls.self_signed((), NOW)[0] != cert_pem  # a fresh key and serial each start


def _folder(tmp_path, cert: bytes | None, key: bytes | None):
    for name, data in (("tls.crt", cert), ("tls.key", key)):
        if data is not None:
            (tmp_path / name).write_bytes(data)
    return str(tmp_path)


def test_cert_path_serves_the_folders_pair(tmp_path):
    pair = tls.self_signed((("dns", "x"),), NOW)
    assert tls.certificate(_folder(tmp_path, *pair), "10.0.0.1", "h", NOW) == pair


@pytest.mark.parametrize("case, match", [
    ("no cert", f"{CERT_PATH_FLAG} .*: cannot read tls.crt"),
    ("no key", "cannot read tls.key"),
    ("cert not PEM", "tls.crt is not a PEM certificate"),
    ("key not PEM", "tls.key is not an unencrypted PEM private key"),
    ("another key", "tls.key is not the key of .*tls.crt"),
])
def test_a_bad_cert_path_names_the_file(tmp_path, case, match):
    cert, key = tls.self_signed((), NOW)
    other_key = tls.self_signed((), NOW)[1]
    files = {"no cert": (None, key), "no key": (cert, None), "cert not PEM": (b"junk", key),
             "key not PEM": (cert, b"junk"), "another key": (cert, other_key)}[case]
    with pytest.raises(tls.TlsError, match=match):
        tls.load(_folder(tmp_path, *files))


@pytest.mark.parametrize("grpc_port, health_port, http_port, want", [
    (EPP_GRPC, EPP_GRPC_HEALTH, EPP_METRICS, None),
    (0, EPP_GRPC_HEALTH, EPP_METRICS, "--grpc-port must be 1..65535"),
    (EPP_GRPC, 70000, EPP_METRICS, "--grpc-health-port must be 1..65535"),
    (EPP_GRPC, EPP_GRPC, EPP_METRICS, "--grpc-port and --grpc-health-port must differ"),
    (EPP_GRPC, EPP_METRICS, EPP_METRICS, "--grpc-health-port and --port must differ"),
    (EPP_METRICS, EPP_GRPC_HEALTH, EPP_METRICS, "--grpc-port and --port must differ"),
])
def test_port_rules(grpc_port, health_port, http_port, want):
    got = _port_problem(grpc_port, health_port, http_port)
    assert got == want if want is None else want in got


def _epp_cluster(mode, **kw):
    cfg = yaml.safe_load(render(mode, listen_port=10000, epp_port=9002, admin_port=9901, caller_token=TOKEN,
                                decode_only=("http://10.0.0.8:8000",), **kw))
    (epp,) = [c for c in cfg["static_resources"]["clusters"] if c["name"] == "epp"]
    return epp


@pytest.mark.parametrize("mode", [BUFFERED, FULL_DUPLEX])
@pytest.mark.parametrize("epp_tls, want", [(True, EPP_TLS), (False, EPP_PLAINTEXT)])
def test_the_epp_cluster_speaks_tls_to_a_secure_epp_verifying_nothing(mode, epp_tls, want):
    socket = _epp_cluster(mode, epp_tls=epp_tls)["transport_socket"]
    assert socket == want
    if epp_tls:  # no validation_context: nothing verified, as Envoy AI Gateway and agentgateway
        assert socket["typed_config"]["common_tls_context"] == {"alpn_protocols": ["h2"]}


@pytest.mark.parametrize("mode", [BUFFERED, FULL_DUPLEX])
@pytest.mark.parametrize("epp_tls", [True, False])
def test_envoy_accepts_the_rendered_config(mode, epp_tls, tmp_path):
    path = tmp_path / "envoy.yaml"
    path.write_text(render(mode, listen_port=10000, epp_port=9002, admin_port=9901, caller_token=TOKEN,
                           decode_only=("http://10.0.0.8:8000",), epp_tls=epp_tls))
    proc = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(path)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
