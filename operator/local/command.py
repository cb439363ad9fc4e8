"""`pdfleet local -f CR.yaml`: run the fleet a DisaggregatedInference describes as local processes.

Validates the resource with the API models, generates the built-in tiny model when
the resource names it, starts the prefill and decode engines (the plan's vLLM
command, on loopback, free ports, each pinned to its own CPUs), waits until they
are healthy, starts the P/D router in this process, warms every prefill/decode pair
with a request of its own (warmup.py; --warmup-rounds 0: none) and prints exactly one
line `router: http://127.0.0.1:PORT` on stdout. Progress and diagnostics go to stderr.

Without --smoke it serves until Ctrl-C or SIGTERM, restarting an engine that
exits (a few times, like a StatefulSet would). With --smoke it sends a few
requests through the router, prints the P/D output and a table of KV transfer figures
per engine (--metrics-raw: the raw metric lines too), and exits 0 only if all passed.
Every child process is stopped on the way out.

This module is the command line (flags, the resource read and checked); the run itself is
runner.LocalRunner.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
from pathlib import Path
from typing import Any

import yaml

from pdfleet.operator.local.console import EXIT_FAILED, err


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--file", required=True, type=Path, help="DisaggregatedInference YAML file")
    parser.add_argument("--router-port", type=int, default=0, help="router port on 127.0.0.1 (default: a free one)")
    parser.add_argument("--gateway", action="store_true",
                        help="also start a real Envoy in front of the fleet through the Endpoint Picker (pdfleet[gateway])"
                             " and print `gateway: http://127.0.0.1:PORT`")
    parser.add_argument("--smoke", action="store_true",
                        help="send a few requests through the router, print output and KV transfer figures, then stop")
    parser.add_argument("--metrics-raw", action="store_true",
                        help="with --smoke, also print the raw connector and router metric lines")
    parser.add_argument("--startup-timeout", type=float, default=600.0, metavar="SECONDS",
                        help="how long engines may take to become healthy (default 600)")
    parser.add_argument("--run-dir", type=Path, default=None,
                        help="where engine logs go (default: a new temporary directory, kept on failure)")
    parser.add_argument("--state-file", type=Path, default=None,
                        help="write the fleet's processes, ports and logs as JSON here (for tests and tools)")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="cache of the generated tiny model (default $PDFLEET_CACHE_DIR or ~/.cache/pdfleet)")
    parser.add_argument("--preflight-only", action="store_true",
                        help="run the fabric preflight (KVTransport), print it and exit: 0 if True, 1 if False")
    parser.add_argument("--max-restarts", type=int, default=3,
                        help="times an engine that exits is started again before the fleet stops (default 3)")
    parser.add_argument("--warmup-rounds", type=_non_negative_int, default=None, metavar="N",
                        help="P/D requests each prefill/decode pair serves before the router line (handshakes,"
                             " first transfers; default 2, 0: none)")
    parser.add_argument("--no-launcher", action="store_true",
                        help="with scale to zero, start each engine as a fresh interpreter (default: a launcher that"
                             " imported vLLM once forks them, a faster wake)")


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def load_resource(path: Path) -> Any:
    """The parsed resource, or a list of error lines."""
    from pdfleet.operator.api import InvalidResource, parse

    try:
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    except OSError as exc:
        return [f"{path}: cannot read: {exc.strerror}"]
    except yaml.YAMLError as exc:
        return [f"{path}: not valid YAML: {exc}"]
    if len(docs) != 1:
        return [f"{path}: expected exactly one DisaggregatedInference document, found {len(docs)}"]
    try:
        return parse(docs[0])
    except InvalidResource as exc:
        return [f"{path}: {e}" for e in exc.errors]


def has_gpu() -> bool:
    return Path("/dev/nvidiactl").exists() or shutil.which("nvidia-smi") is not None


def run(args: argparse.Namespace) -> int:
    from pdfleet.operator.local.fleet import local_errors
    from pdfleet.operator.local.runner import LocalRunner

    resource = load_resource(args.file)
    if isinstance(resource, list):
        for line in resource:
            err(f"error: {line}")
        return EXIT_FAILED
    problems = local_errors(resource.spec, has_gpu=has_gpu())
    if problems:
        for e in problems:
            err(f"error: {args.file}: {e}")
        return EXIT_FAILED
    if not 0 <= args.router_port <= 65535:
        err(f"error: --router-port: must be in 0..65535, got {args.router_port}")
        return EXIT_FAILED
    return asyncio.run(LocalRunner(resource, args).main())
