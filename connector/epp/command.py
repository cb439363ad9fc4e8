"""`pdfleet epp`: the gateway's Endpoint Picker (ext_proc gRPC) over the fleet's engines.

It takes the router's flags (contract/router_config.py: static --prefill/--decode or Kubernetes
discovery, picking policies, limits, flow control); its --host/--port serve /health and /metrics,
and --grpc-port the ext_proc stream the gateway opens, for callers that send the caller token
(PDFLEET_EPP_CALLER_TOKEN; caller_auth.py), or for any caller with --insecure-any-caller. The ext_proc port
serves TLS by default (--secure-serving, as GAIE's EPP; --cert-path, else a self-signed certificate: tls.py), and
--grpc-health-port serves grpc.health.v1 alone in plaintext for the kubelet's gRPC probes.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from pdfleet.contract import router_config
from pdfleet.contract.env import EPP_CALLER_TOKEN
from pdfleet.contract.gateway import (
    CALLER_TOKEN_METADATA, CERT_PATH_FLAG, EPP_GRPC, EPP_GRPC_HEALTH, EPP_METRICS, GRPC_HEALTH_PORT_FLAG,
    GRPC_PORT_FLAG, INSECURE_ANY_CALLER_FLAG, NO_SECURE_SERVING_FLAG, SECURE_SERVING_FLAG, TLS_CERT_FILE, TLS_KEY_FILE,
)

log = logging.getLogger("pdfleet.epp")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    router_config.add_arguments(parser)
    # The router's --port serves its API; the EPP's serves /health and /metrics, on the port the plan renders.
    health = parser._option_string_actions["--port"]  # noqa: SLF001 - argparse has no public way to re-word a flag
    health.default, health.help = EPP_METRICS, "port of /health and /metrics (HTTP); default %(default)s"
    parser.add_argument(GRPC_PORT_FLAG, type=int, default=EPP_GRPC, dest="grpc_port",
                        help="the ext_proc gRPC port the gateway dials (InferencePool endpointPickerRef.port); "
                             "default %(default)s")
    parser.add_argument(GRPC_HEALTH_PORT_FLAG, type=int, default=EPP_GRPC_HEALTH, dest="grpc_health_port",
                        help="grpc.health.v1 alone, in plaintext, for the kubelet's gRPC probes (which cannot do TLS); "
                             "default %(default)s")
    parser.add_argument(SECURE_SERVING_FLAG, action=argparse.BooleanOptionalAction, default=True,
                        dest="secure_serving",
                        help=f"serve ext_proc over TLS (default; as GAIE's EPP: the gateways dial it over TLS); "
                             f"{NO_SECURE_SERVING_FLAG} serves h2c")
    parser.add_argument(CERT_PATH_FLAG, default=None, dest="cert_path", metavar="DIR",
                        help=f"the folder holding {TLS_CERT_FILE} and {TLS_KEY_FILE} (e.g. a kubernetes.io/tls "
                             "Secret mounted); unset: a self-signed certificate made at start")
    parser.add_argument(INSECURE_ANY_CALLER_FLAG, action="store_true", dest="any_caller",
                        help=f"serve ext_proc callers without the caller token ({EPP_CALLER_TOKEN}, sent in the gRPC "
                             f"metadata {CALLER_TOKEN_METADATA}); without this flag the EPP refuses to start with no "
                             "token. Only where nothing but your gateway can reach the port")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = router_config.from_args(args)
    except ValueError as exc:
        print(f"pdfleet epp: {exc}", file=sys.stderr)
        return 2
    problem = _port_problem(args.grpc_port, args.grpc_health_port, config.port)
    if problem:
        print(f"pdfleet epp: {problem}", file=sys.stderr)
        return 2
    if args.cert_path and not args.secure_serving:
        print(f"pdfleet epp: {CERT_PATH_FLAG} needs {SECURE_SERVING_FLAG} (given {NO_SECURE_SERVING_FLAG})",
              file=sys.stderr)
        return 2
    try:
        import grpc  # noqa: F401
        from envoy.service.ext_proc.v3 import external_processor_pb2  # noqa: F401
    except ImportError as exc:
        print(f"pdfleet epp: needs pdfleet[gateway] (grpcio, xds-protos): {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(config, args))


def _port_problem(grpc_port: int, health_port: int, http_port: int) -> str | None:
    """What is wrong with the three ports, naming the flags; None when nothing."""
    for flag, value in ((GRPC_PORT_FLAG, grpc_port), (GRPC_HEALTH_PORT_FLAG, health_port)):
        if not 0 < value < 65536:
            return f"{flag} must be 1..65535, got {value}"
    for (a, x), (b, y) in (((GRPC_PORT_FLAG, grpc_port), ("--port", http_port)),
                           ((GRPC_HEALTH_PORT_FLAG, health_port), ("--port", http_port)),
                           ((GRPC_PORT_FLAG, grpc_port), (GRPC_HEALTH_PORT_FLAG, health_port))):
        if x == y:
            return f"{a} and {b} must differ (both {x})"
    return None


async def _serve(config, args: argparse.Namespace) -> int:
    import datetime as dt
    import socket

    from pdfleet.connector.epp import tls
    from pdfleet.connector.epp.caller_auth import CallerTokenError
    from pdfleet.connector.epp.server import EndpointPicker

    from pdfleet.connector.serving.engine_auth import EngineTokenError

    try:
        # an empty value counts as unset (a Secret key that holds nothing)
        epp = EndpointPicker(config, caller_token=os.environ.get(EPP_CALLER_TOKEN) or None,
                             any_caller=args.any_caller)
        pair = (tls.certificate(args.cert_path, config.host, socket.gethostname(), dt.datetime.now(dt.timezone.utc))
                if args.secure_serving else None)
    except (EngineTokenError, CallerTokenError, tls.TlsError) as exc:
        print(f"pdfleet epp: {exc}", file=sys.stderr)
        return 2
    try:
        bound = await epp.start(config.host, args.grpc_port, metrics_port=config.port, tls_pair=pair,
                                health_port=args.grpc_health_port)
    except OSError as exc:
        print(f"pdfleet epp: {exc}", file=sys.stderr)
        await epp.stop(grace=0)
        return 2
    print(f"epp: ext_proc on {config.host}:{bound} ({'TLS' if pair else 'h2c'}), grpc.health.v1 on "
          f"{config.host}:{epp.health_port_bound} (plaintext), /health and /metrics on "
          f"http://{config.host}:{config.port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    # On SIGTERM: streams in flight (prefill legs, answers being relayed) get the request's time to end.
    await epp.stop(grace=config.max_request_seconds())
    return 0
