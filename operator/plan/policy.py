"""PodDisruptionBudgets and the optional NetworkPolicy (pure)."""

from __future__ import annotations

from typing import Any

from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan import naming
from pdfleet.operator.plan.engine import UCX_TCP_PORT_RANGE_VAR, engine_env, parse_port_range
from pdfleet.operator.plan.engines import KV_EVENTS_PORTS, side_channel_ports
from pdfleet.operator.plan.meta import Context, metadata

ROLES = ("prefill", "decode")


def pdb(ctx: Context, spec: DisaggregatedInferenceSpec, role: str) -> dict[str, Any]:
    """One budget per role across revisions, so a rollout's two pairs share it."""
    budget = spec.disruption.prefill if role == "prefill" else spec.disruption.decode
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(ctx, f"{ctx.fleet}-{role}", naming.role_labels(ctx.fleet, role)),
        "spec": {"maxUnavailable": budget.max_unavailable, "selector": {"matchLabels": naming.selector(ctx.fleet, role)}},
    }


def ucx_tcp_ports(spec: DisaggregatedInferenceSpec) -> list[dict[str, Any]]:
    """NetworkPolicy ports for UCX's TCP listeners, as the engines' UCX_TCP_PORT_RANGE pins them.
    RDMA transports (rc, ud, dc) carry no IP traffic the policy sees; cma and cuda_ipc stay on the host."""
    ranges = sorted({r for role in ROLES
                     if (r := parse_port_range(engine_env(spec, role).get(UCX_TCP_PORT_RANGE_VAR, ""))) is not None})
    out = []
    for lo, hi in ranges:
        port: dict[str, Any] = {"protocol": "TCP", "port": lo}
        if hi > lo:
            port["endPort"] = hi
        out.append(port)
    return out


def network_policy(ctx: Context, spec: DisaggregatedInferenceSpec) -> dict[str, Any]:
    """Only the fleet's own pods (engines and router) reach the engines' ports, UCX's TCP ports included."""
    first = spec.kv_transfer.side_channel_port
    last = max(p for role in ROLES for _, p in side_channel_ports(spec, role))
    side: dict[str, Any] = {"protocol": "TCP", "port": first}
    if last > first:
        side["endPort"] = last
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(ctx, f"{ctx.fleet}-engines", naming.fleet_labels(ctx.fleet)),
        "spec": {
            "podSelector": {
                "matchLabels": {naming.FLEET_LABEL: ctx.fleet},
                "matchExpressions": [{"key": naming.ROLE_LABEL, "operator": "In", "values": list(ROLES)}],
            },
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {naming.FLEET_LABEL: ctx.fleet}}}],
                    "ports": [{"protocol": "TCP", "port": spec.engine.port}, side,
                              *({"protocol": "TCP", "port": p} for _, p in KV_EVENTS_PORTS),
                              *ucx_tcp_ports(spec)],
                }
            ],
        },
    }

