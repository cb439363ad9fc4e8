"""`pdfleet router`: run the P/D router (static endpoints or the fleet's EndpointSlices)."""

from __future__ import annotations

import argparse
import logging
import sys

from pdfleet.contract import router_config
from pdfleet.contract.router_config import RouterConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # The RouterConfig flags live with RouterConfig (the plan renders them); these two are the process's.
    router_config.add_arguments(parser)
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--event-loop", default="auto", choices=["auto", "uvloop", "asyncio"],
                        help="auto: uvloop when installed; default %(default)s")


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    return router_config.from_args(args)


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"pdfleet router: {exc}", file=sys.stderr)
        return 2
    if args.revision:
        logging.getLogger("pdfleet.router").warning(
            "--revision is ignored: the operator labels the serving revision on its EndpointSlices")
    from aiohttp import web

    from pdfleet.connector.router.app import build_app

    loop = None
    if args.event_loop != "asyncio":
        try:  # uvloop cuts the router's own CPU time per request (see bench/router_overhead.py)
            import uvloop

            loop = uvloop.new_event_loop()
        except ImportError:
            if args.event_loop == "uvloop":
                print("pdfleet router: --event-loop uvloop: uvloop is not installed", file=sys.stderr)
                return 2
    # On SIGTERM: stop accepting, let requests in flight finish (the pod's grace period is longer).
    web.run_app(build_app(config), host=config.host, port=config.port, handler_cancellation=True, loop=loop,
                shutdown_timeout=config.max_request_seconds(), access_log=None, print=lambda msg: logging.getLogger("pdfleet.router").info(msg))
    return 0
