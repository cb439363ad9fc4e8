"""Behind a cluster Gateway (spec.gateway.inferencePool, pure): the InferencePool over the fleet's
decode pods, and the Endpoint Picker (EPP) the gateway asks which decode serves each request.

The pool selects decode pods of every revision (fleet + role only): the EPP pairs a request with
one revision's prefill and decode, as the router does, so a rollout never edits the pool. The EPP
runs `pdfleet epp` with the router's own discovery and picking flags (RouterConfig), so both front
ends read the same EndpointSlices with the same rights and pick alike.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pdfleet.contract import gateway as gw
from pdfleet.contract.labels import ROLE_DECODE, ROLE_EPP
from pdfleet.contract.ports import HTTP_NAME
from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan import kinds, naming, router
from pdfleet.operator.plan.auth import epp_caller_token_env, needs_epp_caller_secret
from pdfleet.operator.plan.meta import Context, metadata

POOL = kinds.INFERENCE_POOL


def pool_name(fleet: str) -> str:
    """What an HTTPRoute's backendRef names: the fleet's own name."""
    return fleet


def epp_name(fleet: str) -> str:
    return f"{fleet}-epp"


def enabled(spec: DisaggregatedInferenceSpec) -> bool:
    return spec.gateway.inference_pool.enabled


def inference_pool(ctx: Context, spec: DisaggregatedInferenceSpec) -> dict[str, Any]:
    pool = spec.gateway.inference_pool
    return {
        "apiVersion": POOL.api_version,
        "kind": POOL.kind,
        "metadata": metadata(ctx, pool_name(ctx.fleet), naming.fleet_labels(ctx.fleet)),
        "spec": {
            # decode pods of every revision: the gateway sends each request to a decode (the EPP ran its prefill)
            "selector": {"matchLabels": naming.selector(ctx.fleet, ROLE_DECODE)},
            "targetPorts": [{"number": spec.engine.port}],
            "endpointPickerRef": {
                "kind": "Service",
                "name": epp_name(ctx.fleet),
                "port": {"number": pool.epp_port},
                "failureMode": pool.failure_mode,
            },
        },
    }


# The pod's IP (downward API), which the EPP binds: never 0.0.0.0, so only the pod's own address serves
# it (the container's env, expanded by the kubelet in args as $(EPP_POD_IP)).
POD_IP_VAR = "EPP_POD_IP"


def epp_args(ctx: Context, spec: DisaggregatedInferenceSpec) -> list[str]:
    # The router's config with the EPP's HTTP port (health, metrics) on the pod IP: same discovery,
    # policies, flow control.
    config = dataclasses.replace(router.router_config(ctx, spec), host=f"$({POD_IP_VAR})", port=gw.EPP_METRICS)
    pool = spec.gateway.inference_pool
    anyone = [gw.INSECURE_ANY_CALLER_FLAG] if pool.caller_auth == gw.CALLER_AUTH_NONE else []  # behind the policy
    # ext_proc over TLS (a self-signed certificate made at start: the gateways verify nothing), as GAIE's EPP and
    # the gateways that dial it expect; grpc.health.v1 in plaintext for the kubelet's gRPC probes
    return ["epp", *config.to_argv(), gw.GRPC_PORT_FLAG, str(pool.epp_port), gw.SECURE_SERVING_FLAG,
            gw.GRPC_HEALTH_PORT_FLAG, str(gw.EPP_GRPC_HEALTH), *anyone]


def epp_probes() -> dict[str, Any]:
    """gRPC probes on the plaintext health port (a gRPC probe cannot do TLS): readiness follows the endpoints
    (connector/epp/health.py), liveness the process."""
    def probe(service: str, period: int) -> dict[str, Any]:
        return {"grpc": {"port": gw.EPP_GRPC_HEALTH, "service": service}, "periodSeconds": period,
                "failureThreshold": 3}
    return {"readinessProbe": probe(gw.HEALTH_READINESS, 5), "livenessProbe": probe(gw.HEALTH_LIVENESS, 10)}


def deployment(ctx: Context, spec: DisaggregatedInferenceSpec) -> dict[str, Any]:
    ports = [
        {"name": gw.GRPC_PORT_NAME, "containerPort": spec.gateway.inference_pool.epp_port, "protocol": "TCP"},
        {"name": HTTP_NAME, "containerPort": gw.EPP_METRICS, "protocol": "TCP"},
        {"name": gw.GRPC_HEALTH_PORT_NAME, "containerPort": gw.EPP_GRPC_HEALTH, "protocol": "TCP"},
    ]
    # it runs prefill legs and waits on decodes as the router does: the same pod, drain and token
    out = router.front_end_deployment(ctx, spec, role=ROLE_EPP, name=epp_name(ctx.fleet), container_name=ROLE_EPP,
                                      args=epp_args(ctx, spec), ports=ports,
                                      replicas=spec.gateway.inference_pool.epp_replicas)
    # and serves only the gateway that sends the fleet's caller token, on the pod's IP
    token = [epp_caller_token_env(ctx.fleet)] if needs_epp_caller_secret(spec) else []
    container = out["spec"]["template"]["spec"]["containers"][0]
    container["env"] += [*token, {"name": POD_IP_VAR, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]
    container.update(epp_probes())
    return out


def service(ctx: Context, spec: DisaggregatedInferenceSpec) -> dict[str, Any]:
    port = spec.gateway.inference_pool.epp_port
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(ctx, epp_name(ctx.fleet), naming.role_labels(ctx.fleet, ROLE_EPP)),
        "spec": {
            "type": "ClusterIP",
            "selector": naming.selector(ctx.fleet, ROLE_EPP),
            # appProtocol: gateways (Istio, kgateway) speak HTTP/2 to it without guessing; "http2", as GAIE's chart
            # has it, not kubernetes.io/h2c: it serves TLS (--secure-serving). The kubelet reaches the health port
            # on the pod itself: no Service port.
            "ports": [{"name": gw.GRPC_PORT_NAME, "port": port, "targetPort": gw.GRPC_PORT_NAME, "protocol": "TCP",
                       "appProtocol": "http2"}],
        },
    }


def rbac(ctx: Context) -> list[dict[str, Any]]:
    """The router's reads (EndpointSlices, Services' owners), under the EPP's own account."""
    return router.discovery_rbac(ctx, epp_name(ctx.fleet), naming.role_labels(ctx.fleet, ROLE_EPP))


def pdb(ctx: Context, spec: DisaggregatedInferenceSpec) -> dict[str, Any]:
    # one at a time: with failureMode FailClose every EPP gone is an outage
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": metadata(ctx, epp_name(ctx.fleet), naming.role_labels(ctx.fleet, ROLE_EPP)),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": naming.selector(ctx.fleet, ROLE_EPP)}},
    }


def network_policy(ctx: Context, spec: DisaggregatedInferenceSpec) -> dict[str, Any]:
    """The gateway's proxies (allowFrom) reach the decode pods' engine port (the fleet's policy admits only its
    own pods). Only the engine port: side channel, KV events and UCX stay the fleet's."""
    peers = [p.model_dump(mode="json", by_alias=True, exclude_none=True)
             for p in spec.gateway.inference_pool.allow_from]
    rule: dict[str, Any] = {"from": peers, "ports": [{"protocol": "TCP", "port": spec.engine.port}]}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(ctx, f"{ctx.fleet}-gateway", naming.fleet_labels(ctx.fleet)),
        "spec": {
            "podSelector": {"matchLabels": naming.selector(ctx.fleet, ROLE_DECODE)},
            "policyTypes": ["Ingress"],
            "ingress": [rule],
        },
    }


def epp_network_policy(ctx: Context, spec: DisaggregatedInferenceSpec) -> dict[str, Any]:
    """The EPP's pods: the gateway's proxies (allowFrom) reach its ext_proc port; its HTTP port (/health,
    /metrics) and its plaintext grpc.health.v1 port (no credential, no decision: health alone) stay open to
    Prometheus and to the kubelet's probes. Most CNIs do not apply a NetworkPolicy to the kubelet's own probes
    (they come from the node); the rule keeps them working on those that do."""
    peers = [p.model_dump(mode="json", by_alias=True, exclude_none=True)
             for p in spec.gateway.inference_pool.allow_from]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": metadata(ctx, epp_name(ctx.fleet), naming.role_labels(ctx.fleet, ROLE_EPP)),
        "spec": {
            "podSelector": {"matchLabels": naming.selector(ctx.fleet, ROLE_EPP)},
            "policyTypes": ["Ingress"],
            "ingress": [
                # an empty `from` would admit every source: without peers, no rule for the gRPC port
                *([{"from": peers, "ports": [{"protocol": "TCP", "port": spec.gateway.inference_pool.epp_port}]}]
                  if peers else []),
                {"ports": [{"protocol": "TCP", "port": gw.EPP_METRICS}, {"protocol": "TCP", "port": gw.EPP_GRPC_HEALTH}]},
            ],
        },
    }


def children(ctx: Context, spec: DisaggregatedInferenceSpec) -> list[dict[str, Any]]:
    """Everything spec.gateway renders; nothing while the pool is disabled."""
    if not enabled(spec):
        return []
    out = [inference_pool(ctx, spec), *rbac(ctx), deployment(ctx, spec), service(ctx, spec)]
    if spec.disruption.enabled:
        out.append(pdb(ctx, spec))
    # no peers named (validation refuses it): no opening, decode stays the fleet's alone (an empty `from`
    # would admit every source)
    if spec.network.network_policy and spec.gateway.inference_pool.allow_from:
        out.append(network_policy(ctx, spec))
    if spec.network.network_policy:  # no peers: the EPP's gRPC port admits nobody
        out.append(epp_network_policy(ctx, spec))
    return out
