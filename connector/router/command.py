"""`pdfleet router`: run the P/D router (static endpoints or the fleet's EndpointSlices)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from pdfleet.connector.router.config import RouterConfig


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = RouterConfig.__dataclass_fields__
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (in a pod: the pod IP or 0.0.0.0); default %(default)s")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on; default %(default)s")
    src = parser.add_argument_group("endpoints: static lists, or the fleet's EndpointSlices")
    src.add_argument("--prefill", action="append", default=[], metavar="URL",
                     help="prefill engine base URL, e.g. http://10.0.0.7:8000 (repeat for several)")
    src.add_argument("--decode", action="append", default=[], metavar="URL", help="decode engine base URL (repeat)")
    src.add_argument("--kubernetes", action="store_true",
                     help="take endpoints from the fleet's EndpointSlices instead of --prefill/--decode")
    src.add_argument("--fleet", default=os.environ.get("PDFLEET_FLEET"), metavar="NAME",
                     help="with --kubernetes: the fleet (CR name), label pdfleet.io/fleet (env PDFLEET_FLEET)")
    src.add_argument("--fleet-uid", default=os.environ.get("PDFLEET_FLEET_UID") or None, metavar="UID",
                     help="with --kubernetes: the fleet's uid; only Services whose owner reference carries it "
                          "are the fleet's (env PDFLEET_FLEET_UID; the operator sets it)")
    src.add_argument("--namespace", default=os.environ.get("POD_NAMESPACE", "default"),
                     help="namespace of the fleet (env POD_NAMESPACE); default %(default)s")
    src.add_argument("--kubeconfig", default=None,
                     help="kubeconfig file; default: in-cluster service account, else KUBECONFIG")
    src.add_argument("--port-name", default=d["port_name"].default,
                     help="EndpointSlice port serving the OpenAI API; default %(default)s")
    src.add_argument("--revision", default=os.environ.get("PDFLEET_ACTIVE_REVISION"),
                     help="revision the operator wants served while it is serviceable "
                          "(env PDFLEET_ACTIVE_REVISION); default: newest serviceable")
    kv = parser.add_argument_group("KV-cache-aware routing")
    for name in ("prefill_policy", "decode_policy"):
        kv.add_argument("--" + name.replace("_", "-"), default=d[name].default,
                        choices=["prefixAware", "leastOutstanding"], help="default %(default)s")
    kv.add_argument("--kv-events", action="append", default=[], metavar="URL=PUB[,REPLAY]",
                    help="static endpoints: an engine's KV event ZMQ endpoints, e.g. "
                         "http://10.0.0.7:8000=tcp://10.0.0.7:5557,tcp://10.0.0.7:5558 (repeat); "
                         "with --kubernetes they come from the EndpointSlices' kv-events ports")
    kv.add_argument("--tokenizer", default=None, help="the served model's tokenizer (name or path), "
                    "to hash prompts as the engines do; without it the router uses what it routed itself")
    kv.add_argument("--block-size", type=int, default=d["block_size"].default, help="the engines' --block-size")
    kv.add_argument("--hash-seed", default=d["hash_seed"].default,
                    help="the engines' PYTHONHASHSEED, if set; default vLLM's %(default)s")
    kv.add_argument("--prefix-max-imbalance", type=int, default=d["prefix_max_imbalance"].default,
                    help="requests in flight above the least loaded a cached prefix may cost; default %(default)s")
    kv.add_argument("--prompt-cache-max-bytes", type=int, default=d["prompt_cache_max_bytes"].default,
                    help="memory for prompt prefixes already tokenized (LRU), in bytes; default %(default)s")
    lim = parser.add_argument_group("limits and timeouts")
    for name, kind, help_text in [
        ("max_body_bytes", int, "largest request body; bigger gets 413"),
        ("prefill_attempts", int, "prefill endpoints tried before decode serves alone"),
        ("decode_attempts", int, "decode endpoints tried before 502"),
        ("lease_margin_s", float, "reuse prefill's KV on a decode retry only with this much lease left"),
        ("connect_timeout_s", float, "TCP connect timeout per leg"),
        ("prefill_timeout_s", float, "whole prefill leg"),
        ("decode_first_byte_timeout_s", float, "until decode's response headers"),
        ("decode_idle_timeout_s", float, "between two chunks of decode's response"),
        ("eject_s", float, "how long a failed endpoint is avoided"),
        ("upstream_keepalive_s", float, "idle upstream connections closed after this (below the engines' own)"),
    ]:
        lim.add_argument("--" + name.replace("_", "-"), type=kind, default=d[name].default,
                         help=f"{help_text}; default %(default)s")
    parser.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--event-loop", default="auto", choices=["auto", "uvloop", "asyncio"],
                        help="auto: uvloop when installed; default %(default)s")


def config_from_args(args: argparse.Namespace) -> RouterConfig:
    if args.kubernetes and not args.fleet:
        raise ValueError("--kubernetes needs --fleet NAME (or env PDFLEET_FLEET)")
    if args.kubernetes and (args.prefill or args.decode):
        raise ValueError("--kubernetes and --prefill/--decode exclude each other")
    kv_events = []
    for item in args.kv_events:
        url, sep, endpoints = item.partition("=")
        if not sep:
            raise ValueError(f"--kv-events {item!r}: expected URL=PUB[,REPLAY]")
        kv_events.append((url, endpoints))
    return RouterConfig(
        prefill_policy=args.prefill_policy, decode_policy=args.decode_policy, kv_events=tuple(kv_events),
        tokenizer=args.tokenizer, block_size=args.block_size, hash_seed=args.hash_seed,
        prefix_max_imbalance=args.prefix_max_imbalance, prompt_cache_max_bytes=args.prompt_cache_max_bytes,
        prefill=tuple(args.prefill), decode=tuple(args.decode),
        kubernetes_fleet=args.fleet if args.kubernetes else None, kubernetes_namespace=args.namespace,
        kubernetes_fleet_uid=args.fleet_uid if args.kubernetes else None,
        kubeconfig=args.kubeconfig, port_name=args.port_name, revision=args.revision or None,
        max_body_bytes=args.max_body_bytes, prefill_attempts=args.prefill_attempts,
        decode_attempts=args.decode_attempts, lease_margin_s=args.lease_margin_s,
        connect_timeout_s=args.connect_timeout_s, prefill_timeout_s=args.prefill_timeout_s,
        decode_first_byte_timeout_s=args.decode_first_byte_timeout_s,
        decode_idle_timeout_s=args.decode_idle_timeout_s, eject_s=args.eject_s,
        upstream_keepalive_s=args.upstream_keepalive_s,
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"pdfleet router: {exc}", file=sys.stderr)
        return 2
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
    web.run_app(build_app(config), host=args.host, port=args.port, handler_cancellation=True, loop=loop,
                shutdown_timeout=config.max_request_seconds(), access_log=None, print=lambda msg: logging.getLogger("pdfleet.router").info(msg))
    return 0
