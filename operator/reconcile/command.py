"""`pdfleet operator`: run the kopf operator.

    pdfleet operator --namespace team-a --namespace team-b --standalone \\
        --liveness http://0.0.0.0:8080/healthz --metrics-port 9090

Credentials: KUBECONFIG when set, else the in-cluster service account.
Scope: one or more --namespace (exact names or kopf globs), or --all-namespaces.
Mode: --standalone (no peering), or --peering NAME (kopf peering: one active operator).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import sys

from pdfleet.operator.plan import DEFAULT_IMAGE
from pdfleet.operator.plan.drain import rollout_drain_seconds
from pdfleet.operator.plan.gang import GANG_KINDS


def add_arguments(parser: argparse.ArgumentParser) -> None:
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", default=[], metavar="NAME",
                       help="serve this namespace (repeatable; kopf globs such as 'team-*' work)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", help="serve every namespace (cluster-wide)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--standalone", action="store_true", help="no peering: assume this is the only operator")
    mode.add_argument("--peering", metavar="NAME", help="kopf peering object name (several replicas, one active)")
    parser.add_argument("--priority", type=int, default=None,
                        help="kopf peering priority; default: derived from POD_ID, so peers never tie")
    parser.add_argument("--liveness", metavar="URL", default=None,
                        help="liveness endpoint, e.g. http://0.0.0.0:8080/healthz")
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve Prometheus metrics on this port (/metrics)")
    parser.add_argument("--default-image", default=os.environ.get("PDFLEET_DEFAULT_IMAGE") or DEFAULT_IMAGE,
                        help="runtime image for fleets without spec.image (env PDFLEET_DEFAULT_IMAGE)")
    parser.add_argument("--drain-seconds", type=float, default=float(rollout_drain_seconds()),
                        help="keep the old prefill/decode pair this long after the router switched; default "
                             "%(default)s, from the router's timeouts (connects + prefill leg + margin)")
    parser.add_argument("--workers", type=int, default=4, help="fleets reconciled at the same time")
    parser.add_argument("--gang-provider", action="append", default=[], choices=tuple(GANG_KINDS),
                        help="a gang scheduler whose PodGroups the operator may create (repeatable; kueue needs none)")
    parser.add_argument("--log-format", choices=("plain", "json"), default="plain",
                        help="json: one object per line with namespace and name of the fleet")
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")


def _validate(args: argparse.Namespace) -> str | None:
    if not args.namespace and not args.all_namespaces:
        return "choose the scope: --namespace NAME (repeatable) or --all-namespaces"
    if args.metrics_port is not None and not (0 <= args.metrics_port <= 65535):
        return f"--metrics-port: {args.metrics_port} is not a port (0-65535)"
    if args.drain_seconds < 0:
        return "--drain-seconds: must be >= 0"
    if args.workers < 1:
        return "--workers: must be >= 1"
    if args.liveness and not args.liveness.startswith(("http://", "https://")):
        return f"--liveness: {args.liveness!r} must be an http:// URL such as http://0.0.0.0:8080/healthz"
    return None


def peering_priority(instance: str) -> int:
    """A stable, per-pod priority: kopf pauses *every* peer that ties for the highest one."""
    return int.from_bytes(hashlib.sha256(instance.encode()).digest()[:4], "big") % 1_000_000 + 1


def run(args: argparse.Namespace) -> int:
    problem = _validate(args)
    if problem:
        print(f"pdfleet operator: {problem}", file=sys.stderr)
        return 2
    from pdfleet.operator.reconcile import logs

    logs.configure(args.log_format, args.verbose)
    import kopf  # imported here: `pdfleet validate` and friends never import kopf

    from pdfleet.operator.reconcile.handlers import OperatorOptions, build_registry
    from pdfleet.operator.reconcile.reconciler import ReconcileOptions

    instance = os.environ.get("POD_ID") or os.uname().nodename
    options = OperatorOptions(
        reconcile=ReconcileOptions(default_image=args.default_image, drain_seconds=args.drain_seconds,
                                   workers=args.workers, instance=instance,
                                   gang_providers=tuple(dict.fromkeys(args.gang_provider))),
        metrics_port=args.metrics_port,
    )
    try:
        asyncio.run(kopf.operator(
            registry=build_registry(options),
            clusterwide=bool(args.all_namespaces),
            namespaces=[] if args.all_namespaces else list(args.namespace),
            standalone=True if args.standalone else None,
            peering_name=args.peering,
            priority=(args.priority if args.priority is not None else peering_priority(instance)) if args.peering else None,
            liveness_endpoint=args.liveness,
        ))
    except KeyboardInterrupt:
        return 130
    return 0
