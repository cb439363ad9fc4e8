"""`pdfleet epp`: the gateway's Endpoint Picker (ext_proc gRPC) over the fleet's engines.

It takes the router's flags (contract/router_config.py: static --prefill/--decode or Kubernetes
discovery, picking policies, limits, flow control); its --host/--port serve /health and /metrics,
and --grpc-port the ext_proc stream the gateway opens, for callers that send the caller token
(PDFLEET_EPP_CALLER_TOKEN; caller_auth.py), or for any caller with --insecure-any-caller.
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
    CALLER_TOKEN_METADATA, EPP_GRPC, EPP_METRICS, GRPC_PORT_FLAG, INSECURE_ANY_CALLER_FLAG,
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
    if not 0 < args.grpc_port < 65536:
        print(f"pdfleet epp: {GRPC_PORT_FLAG} must be 1..65535, got {args.grpc_port}", file=sys.stderr)
        return 2
    if args.grpc_port == config.port:
        print(f"pdfleet epp: {GRPC_PORT_FLAG} and --port must differ (both {config.port})", file=sys.stderr)
        return 2
    try:
        import grpc  # noqa: F401
        from envoy.service.ext_proc.v3 import external_processor_pb2  # noqa: F401
    except ImportError as exc:
        print(f"pdfleet epp: needs pdfleet[gateway] (grpcio, xds-protos): {exc}", file=sys.stderr)
        return 2
    return asyncio.run(_serve(config, args.grpc_port, any_caller=args.any_caller))


async def _serve(config, grpc_port: int, *, any_caller: bool) -> int:
    from pdfleet.connector.epp.caller_auth import CallerTokenError
    from pdfleet.connector.epp.server import EndpointPicker

    from pdfleet.connector.serving.engine_auth import EngineTokenError

    try:
        # an empty value counts as unset (a Secret key that holds nothing)
        epp = EndpointPicker(config, caller_token=os.environ.get(EPP_CALLER_TOKEN) or None, any_caller=any_caller)
    except (EngineTokenError, CallerTokenError) as exc:
        print(f"pdfleet epp: {exc}", file=sys.stderr)
        return 2
    try:
        bound = await epp.start(config.host, grpc_port, metrics_port=config.port)
    except OSError as exc:
        print(f"pdfleet epp: {exc}", file=sys.stderr)
        await epp.stop(grace=0)
        return 2
    print(f"epp: ext_proc on {config.host}:{bound}, /health and /metrics on http://{config.host}:{config.port}",
          flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    # On SIGTERM: streams in flight (prefill legs, answers being relayed) get the request's time to end.
    await epp.stop(grace=config.max_request_seconds())
    return 0
