"""The Envoy configs in envoy/ (GAIE's reference proxy shape), filled in with ports (pure)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from string import Template

from pdfleet.connector.epp import caller_auth
from pdfleet.connector.epp.protocol import endpoint_address
from pdfleet.contract.gateway import CALLER_TOKEN_METADATA, FAIL_CLOSE, FAIL_OPEN, FAILURE_MODES
from pdfleet.contract.routing import FALLBACK_DECODE_ONLY, FALLBACK_HEADER

BUFFERED = "buffered"
FULL_DUPLEX = "full-duplex"
MODES = {BUFFERED: "envoy-buffered.yaml", FULL_DUPLEX: "envoy-full-duplex.yaml"}
# FailOpen without the EPP: decode serves alone, and says so as the router does.
_FALLBACK = [{"header": {"key": FALLBACK_HEADER, "value": FALLBACK_DECODE_ONLY},
              "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]


def message_timeout_for(prefill_timeout_s: float, prefill_attempts: int, max_queue_s: float = 0.0,
                        waiting_s: float = 0.0) -> float:
    """The ext_proc message_timeout that never cuts a prefill leg: the EPP answers the body once the
    waiting room's hold (``waiting_s``: the activation timeout while it is on), its flow-control waits
    (for admission, then for a decode slot after prefill: each up to maxQueueSeconds) and every prefill
    attempt are over (plus a margin for the pick and the proxy)."""
    return waiting_s + 2 * max_queue_s + prefill_timeout_s * max(1, prefill_attempts) + 5.0


def _duration(seconds: float) -> str:
    return f"{seconds:.3f}s"


# The epp cluster's transport: TLS verifying nothing (a secure-serving EPP's certificate is self-signed or its own
# CA's; Envoy AI Gateway and agentgateway verify nothing either), ALPN h2 as gRPC over TLS expects; else h2c.
EPP_TLS = {"name": "envoy.transport_sockets.tls", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext",
    "common_tls_context": {"alpn_protocols": ["h2"]}}}
EPP_PLAINTEXT = {"name": "envoy.transport_sockets.raw_buffer", "typed_config": {
    "@type": "type.googleapis.com/envoy.extensions.transport_sockets.raw_buffer.v3.RawBuffer"}}


# HTTP/2 PINGs on the connection to the EPP: an EPP that vanishes without a reset (node lost, pod
# frozen, partition) is noticed within interval x 1.15 (Envoy's jitter) + timeout, 16.5 s, not after
# message_timeout (300 s, sized above a whole prefill leg) or, in FULL_DUPLEX, stream_idle_timeout.
# Cost: a 17-byte PING and its ack per connection every 10 s. 5 s is far above an in-cluster round
# trip, so a busy but live EPP is not cut (each cut ends its in-flight requests per failure_mode).
KEEPALIVE_INTERVAL_S = 10.0
KEEPALIVE_TIMEOUT_S = 5.0


def render(mode: str, *, listen_port: int, epp_port: int, admin_port: int, caller_token: str,
           decode_only: Sequence[str] = (), failure_mode: str = FAIL_CLOSE, message_timeout_s: float = 300.0,
           connect_timeout_s: float = 3.0,
           stream_idle_timeout_s: float = 300.0, keepalive_interval_s: float = KEEPALIVE_INTERVAL_S,
           keepalive_timeout_s: float = KEEPALIVE_TIMEOUT_S, host: str = "127.0.0.1",
           epp_host: str = "127.0.0.1", epp_tls: bool = False) -> str:
    """The Envoy bootstrap for ``mode`` (BUFFERED or FULL_DUPLEX).

    ``caller_token``: the EPP's caller token (caller_auth.py), sent on every ext_proc stream.
    ``decode_only``: decode base URLs that serve when the EPP is down under FailOpen.
    ``message_timeout_s`` must outlast a whole prefill leg (the EPP runs it while Envoy waits).
    ``keepalive_interval_s`` / ``keepalive_timeout_s``: HTTP/2 PINGs on the connection to the EPP, which
    bound how long requests wait on an EPP that went silent without closing its connection.
    ``epp_tls``: the EPP serves TLS (``pdfleet epp`` by default): the epp cluster speaks it, verifying nothing.
    """
    if mode not in MODES:
        raise ValueError(f"gateway mode must be one of {', '.join(MODES)}, got {mode!r}")
    if failure_mode not in FAILURE_MODES:
        raise ValueError(f"failureMode must be one of {', '.join(FAILURE_MODES)}, got {failure_mode!r}")
    if message_timeout_s <= 0:
        raise ValueError(f"message_timeout_s must be > 0, got {message_timeout_s}")
    for name, value in (("keepalive_interval_s", keepalive_interval_s), ("keepalive_timeout_s", keepalive_timeout_s)):
        if not value >= 0.001:  # Envoy's floor (1 ms); NaN refused too
            raise ValueError(f"{name} must be >= 0.001 s, got {value}")
    caller_token = caller_auth.caller_token(caller_token, any_caller=False)  # a bad one would fail every request
    endpoints = []
    for url in decode_only:
        ip, _, port = endpoint_address(url).rpartition(":")
        endpoints.append({"endpoint": {"address": {"socket_address": {"address": ip.strip("[]"),
                                                                       "port_value": int(port)}}}})
    text = resources.files("pdfleet.connector.epp").joinpath("envoy", MODES[mode]).read_text()
    return Template(text).substitute(
        caller_token_key=CALLER_TOKEN_METADATA, caller_token=caller_token,
        host=host, listen_port=listen_port, admin_port=admin_port, epp_host=epp_host, epp_port=epp_port,
        failure_mode_allow="true" if failure_mode == FAIL_OPEN else "false",
        message_timeout=_duration(message_timeout_s), connect_timeout=_duration(connect_timeout_s),
        stream_idle_timeout=_duration(stream_idle_timeout_s), keepalive_interval=_duration(keepalive_interval_s),
        keepalive_timeout=_duration(keepalive_timeout_s), decode_only_endpoints=json.dumps(endpoints),
        fallback_headers=json.dumps(_FALLBACK if failure_mode == FAIL_OPEN else []),
        epp_transport_socket=json.dumps(EPP_TLS if epp_tls else EPP_PLAINTEXT))
