"""The P/D router: Deployment, Service and the RBAC to read EndpointSlices (pure)."""

from __future__ import annotations

from typing import Any

from pdfleet.contract import env as env_names
from pdfleet.contract.flow_control import FlowControlConfig, Priority
from pdfleet.contract.kv_tiers import MEDIUM_CPU, MEDIUM_GPU, MEDIUM_STORAGE
from pdfleet.contract.ports import HTTP_NAME
from pdfleet.contract.router_config import DECODE_REUSE_OFF, RouterConfig
from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan import drain, naming
from pdfleet.operator.plan.engine import hash_seed, model_path
from pdfleet.operator.plan.auth import client_api_token_env
from pdfleet.operator.plan.meta import Context, metadata
from pdfleet.operator.plan.model_files import tokenizer_files

RESTRICTED_CONTAINER_SECURITY = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def router_config(ctx: Context, spec: DisaggregatedInferenceSpec) -> RouterConfig:
    """What the router pod runs. No revision: the router reads the serving revision from the
    engine Services' label, so a rollout never changes (and so never restarts) the router."""
    return RouterConfig(
        host="0.0.0.0",
        port=spec.router.port,
        kubernetes_fleet=ctx.fleet,
        kubernetes_namespace=ctx.namespace,
        prefill_policy=spec.router.prefill_policy,
        decode_policy=spec.router.decode_policy,
        # the engines' block hashing, so that the router computes the same hashes
        tokenizer=model_path(spec),
        block_size=spec.engine.block_size,
        hash_seed=hash_seed(spec),
        flow_control=flow_control_config(spec),
        **disaggregation_fields(spec),
        **prefix_scoring_fields(spec),
        **scale_to_zero_fields(spec),
    )


def disaggregation_fields(spec: DisaggregatedInferenceSpec) -> dict[str, Any]:
    """spec.router.disaggregation as RouterConfig's fields."""
    d = spec.router.disaggregation
    reuse = spec.kv_transfer.decode_reuse  # how a P/D turn's decode leg and the next prefill leg go
    return {"disaggregation_policy": d.policy, "min_remote_prefill_tokens": d.min_remote_prefill_tokens,
            "prefill_busy_in_flight": d.prefill_busy_in_flight,
            "decode_reuse_min_tokens": reuse.min_reusable_tokens if reuse.enabled else DECODE_REUSE_OFF}


def prefix_scoring_fields(spec: DisaggregatedInferenceSpec) -> dict[str, Any]:
    """spec.router.prefixScoring as RouterConfig's fields (rendered only when not the defaults)."""
    w = spec.router.prefix_scoring.tier_weights
    return {"prefix_tier_weights": ((MEDIUM_GPU, w.gpu), (MEDIUM_CPU, w.cpu), (MEDIUM_STORAGE, w.storage))}


def scale_to_zero_fields(spec: DisaggregatedInferenceSpec) -> dict[str, Any]:
    """spec.scaling.scaleToZero as the waiting room's settings (both front ends); off (0) unless enabled."""
    s = spec.scaling.scale_to_zero
    if s is None or not s.enabled:
        return {}
    return {"scale_to_zero_max_waiting": s.max_waiting,
            "scale_to_zero_activation_timeout_s": float(s.activation_timeout_seconds)}


def flow_control_config(spec: DisaggregatedInferenceSpec) -> FlowControlConfig:
    """spec.router.flowControl as the router's settings (rendered by RouterConfig only while enabled)."""
    fc = spec.router.flow_control
    return FlowControlConfig(
        enabled=fc.enabled, max_queue_s=float(fc.max_queue_seconds), max_queued=fc.max_queued_requests,
        max_in_flight_per_decode=fc.max_in_flight_per_decode, tenant_header=fc.tenant_header,
        priority_header=fc.priority_header, priorities=tuple(Priority(p.name, p.weight) for p in fc.priorities),
        fairness=fc.fairness,
    )


def router_args(ctx: Context, spec: DisaggregatedInferenceSpec) -> list[str]:
    return ["router", *router_config(ctx, spec).to_argv()]


def deployment(ctx: Context, spec: DisaggregatedInferenceSpec) -> dict[str, Any]:
    ports = [{"name": HTTP_NAME, "containerPort": spec.router.port, "protocol": "TCP"}]
    return front_end_deployment(ctx, spec, role=naming.ROUTER, name=naming.router_name(ctx.fleet),
                                container_name="router", args=router_args(ctx, spec), ports=ports,
                                replicas=spec.router.replicas)


def front_end_deployment(ctx: Context, spec: DisaggregatedInferenceSpec, *, role: str, name: str,
                         container_name: str, args: list[str], ports: list[dict[str, Any]],
                         replicas: int) -> dict[str, Any]:
    """A Deployment of a front end that picks engines and talks to them: the router, or the gateway's
    Endpoint Picker (plan/gateway.py). Both run `pdfleet`, serve /health on the HTTP port, trust only
    the fleet's Services and hold the engines' API token."""
    labels = naming.role_labels(ctx.fleet, role)
    tokenizer_env, volumes, mounts = tokenizer_files(spec)  # the tokenizer loads as the engines load the model
    probe = {"httpGet": {"path": "/health", "port": HTTP_NAME}, "periodSeconds": 5, "failureThreshold": 3}
    container = {
        "name": container_name,
        "image": ctx.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": ["pdfleet"],
        "args": args,
        "ports": ports,
        # only Services whose owner reference carries this uid are the fleet's (connector/serving/ownership.py),
        # and the engines answer only the fleet's API token (plan/auth.py), which only the front ends mount
        "env": [*([{"name": env_names.FLEET_UID, "value": ctx.owner["uid"]}] if ctx.owner else []),
                *tokenizer_env, client_api_token_env(ctx.fleet)],
        "volumeMounts": mounts,
        "readinessProbe": probe,
        "livenessProbe": {**probe, "periodSeconds": 10},
        "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": RESTRICTED_CONTAINER_SECURITY,
    }
    pod_spec: dict[str, Any] = {
        "serviceAccountName": name,
        # requests in flight (prefill legs, decodes waited on) finish on SIGTERM (plan/drain.py): not 30 s
        "terminationGracePeriodSeconds": drain.ROUTER_GRACE_SECONDS,
        "enableServiceLinks": False,
        "securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [container],
        "volumes": volumes,
    }
    if spec.image_pull_secrets:
        pod_spec["imagePullSecrets"] = [{"name": s.name} for s in spec.image_pull_secrets]
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata(ctx, name, labels),
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": naming.selector(ctx.fleet, role)},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def service(ctx: Context, spec: DisaggregatedInferenceSpec) -> dict[str, Any]:
    name = naming.router_name(ctx.fleet)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": metadata(ctx, name, naming.role_labels(ctx.fleet, naming.ROUTER)),
        "spec": {
            "type": spec.router.service_type,
            "selector": naming.selector(ctx.fleet, naming.ROUTER),
            "ports": [{"name": HTTP_NAME, "port": spec.router.port, "targetPort": HTTP_NAME, "protocol": "TCP"}],
        },
    }


def rbac(ctx: Context) -> list[dict[str, Any]]:
    return discovery_rbac(ctx, naming.router_name(ctx.fleet), naming.role_labels(ctx.fleet, naming.ROUTER))


def discovery_rbac(ctx: Context, name: str, labels: dict[str, str]) -> list[dict[str, Any]]:
    """A ServiceAccount, Role and RoleBinding for the router's endpoint discovery (the EPP's too)."""
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata(ctx, name, labels)},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": metadata(ctx, name, labels),
            "rules": [
                {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
                # to check that a slice's Service is the fleet's (owner reference), never to read Secrets
                {"apiGroups": [""], "resources": ["services"], "verbs": ["list"]},
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": metadata(ctx, name, labels),
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": ctx.namespace}],
        },
    ]
