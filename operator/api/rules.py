"""Cross-field rules of the spec, written once.

Each rule has a Python check (run by `pdfleet validate`, `pdfleet local` and the
operator) and, where the API server can enforce it, a CEL expression that goes
into the CRD as an `x-kubernetes-validations` entry on the spec, so that the
cluster refuses the resource at `kubectl apply`. A rule without CEL is
operator-only: the operator refuses it with Ready=False/InvalidSpec.

CEL sees the spec after the API server applied the CRD's defaults, so defaulted
fields (tensorParallelSize, kvTransfer, engine, ...) are always present.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

from pdfleet.contract import env as env_names
from pdfleet.contract import labels, ports, routing
from pdfleet.contract import gateway
from pdfleet.operator.api import quantity
from pdfleet.operator.api.types import DisaggregatedInferenceSpec, RoleSpec

ROLES = ("prefill", "decode")

# Flags the plan sets from the spec; extraArgs setting them would fork the truth.
OWNED_FLAGS = (
    "--model",
    "--served-model-name",
    "--host",
    "--port",
    "--tensor-parallel-size",
    "-tp",
    "--block-size",
    "--dtype",
    "--max-model-len",
    "--kv-transfer-config",
    "--nnodes",
    "--node-rank",
    "--master-addr",
    "--master-port",
    "--headless",
    "--kv-events-config",  # the router subscribes where the plan says engines publish
    "--prefix-caching-hash-algo",  # the router reproduces the plan's block hash
    "--config",  # a YAML file of flags: could set any of these
    "--api-key",  # the engines answer only the fleet's token (plan/auth.py); a flag would replace it
)
# vLLM's short aliases of owned flags (vllm/engine/arg_utils.py).
OWNED_SHORT_FLAGS = {"-tp": "--tensor-parallel-size", "-n": "--nnodes", "-r": "--node-rank"}
_MIN_ABBREV = 3  # characters after "--": argparse (allow_abbrev) takes any unique prefix of a flag
# The engines' KV event ports.
KV_EVENTS_PORTS = ports.KV_EVENTS_PORTS
RESERVED_LABEL_PREFIXES = (labels.PREFIX, "app.kubernetes.io/")
# Pins the ports of UCX's TCP transport; the plan sets it and its NetworkPolicy opens them.
UCX_TCP_PORT_RANGE_VAR = "UCX_TCP_PORT_RANGE"


def parse_port_range(value: str) -> Optional[tuple[int, int]]:
    """UCX_TCP_PORT_RANGE as (first, last), or None when it pins nothing ("0", or not a range)."""
    first, sep, last = value.strip().partition("-")
    try:
        lo, hi = int(first), int(last) if sep else int(first)
    except ValueError:
        return None
    return (lo, hi) if 1 <= lo <= hi <= 65535 else None


@dataclass(frozen=True)
class FieldError:
    """One problem with a resource: the field (dotted camelCase path) and why."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}"


@dataclass(frozen=True)
class Rule:
    field: str  # path under spec, camelCase, e.g. "decode.tensorParallelSize"
    message: str
    check: Callable[[DisaggregatedInferenceSpec], bool]
    cel: Optional[str] = None  # None: only the operator can check it

    @property
    def spec_field(self) -> str:
        return f"spec.{self.field}"


def ranks_per_pod(role: RoleSpec) -> int:
    """TP ranks one pod runs: the role's TP split over its nodesPerReplica pods."""
    return max(1, role.tensor_parallel_size // role.nodes_per_replica)


def gpus(role: RoleSpec) -> int:
    """GPUs a pod of this role gets: one per TP rank it runs unless set."""
    return ranks_per_pod(role) if role.resources.gpus is None else role.resources.gpus


def is_cpu_engine(role: RoleSpec) -> bool:
    return role.resources.gpus == 0


def max_tp(spec: DisaggregatedInferenceSpec) -> int:
    return max(spec.prefill.tensor_parallel_size, spec.decode.tensor_parallel_size)


def _tp_compatible(spec: DisaggregatedInferenceSpec) -> bool:
    p, d = spec.prefill.tensor_parallel_size, spec.decode.tensor_parallel_size
    return d >= p and d % p == 0


def _cuda_gpus(role_name: str) -> Callable[[DisaggregatedInferenceSpec], bool]:
    def check(spec: DisaggregatedInferenceSpec) -> bool:
        role = spec.role(role_name)
        return spec.kv_transfer.buffer_device != "cuda" or gpus(role) >= ranks_per_pod(role)

    return check


def _ports_distinct(spec: DisaggregatedInferenceSpec) -> bool:
    first = spec.kv_transfer.side_channel_port
    return not (first <= spec.engine.port < first + max_tp(spec))


def _kv_events_ports_free(spec: DisaggregatedInferenceSpec) -> bool:
    first = spec.kv_transfer.side_channel_port
    side = range(first, first + max_tp(spec))
    return not any(p == spec.engine.port or p in side for p in KV_EVENTS_PORTS)


def _side_channel_range(spec: DisaggregatedInferenceSpec) -> bool:
    return spec.kv_transfer.side_channel_port + max_tp(spec) - 1 <= 65535


def _rdma_count(spec: DisaggregatedInferenceSpec) -> bool:
    rdma = spec.network.rdma
    return rdma is None or rdma.resource_name is None or rdma.count >= 1


def _one_model_source(spec: DisaggregatedInferenceSpec) -> bool:
    src = spec.model.source
    return src is None or ((src.pvc is None) != (src.hf is None))


def _cpu_block_size(spec: DisaggregatedInferenceSpec) -> bool:
    cpu = any(is_cpu_engine(spec.role(r)) for r in ROLES)
    return not cpu or spec.engine.block_size % 32 == 0


_MAX_TP_CEL = (
    "(self.prefill.tensorParallelSize > self.decode.tensorParallelSize"
    " ? self.prefill.tensorParallelSize : self.decode.tensorParallelSize)"
)


def _role_cel_gpus(role: str) -> str:
    return (
        f"self.kvTransfer.bufferDevice != 'cuda' || !has(self.{role}.resources.gpus)"
        f" || self.{role}.resources.gpus * self.{role}.nodesPerReplica >= self.{role}.tensorParallelSize"
    )


def _cpu_cel(role: str) -> str:
    return f"(has(self.{role}.resources.gpus) && self.{role}.resources.gpus == 0)"


def _no_test_hooks(path: str) -> Callable[[DisaggregatedInferenceSpec], bool]:
    def check(spec: DisaggregatedInferenceSpec) -> bool:
        env = spec.engine.env if path == "engine" else spec.role(path).env
        return not any(v.name.startswith(env_names.TEST_PREFIX) for v in env)

    return check


# Test-only fault hooks (e.g. one corrupts every pulled block) must never reach a fleet's pods.
TEST_HOOK_RULES: tuple[Rule, ...] = tuple(
    Rule(
        field=f"{path}.env",
        message=f"variables named {env_names.TEST_PREFIX}* are test-only fault hooks and may not be set in a fleet",
        check=_no_test_hooks(path),
        cel=f"!has(self.{path}.env) || self.{path}.env.all(e, !e.name.startsWith('{env_names.TEST_PREFIX}'))",
    )
    for path in ("engine", *ROLES)
)


SPEC_RULES: tuple[Rule, ...] = TEST_HOOK_RULES + (
    Rule(
        field="decode.tensorParallelSize",
        message="must be a multiple of, and not smaller than, prefill.tensorParallelSize "
        "(each decode rank reads a slice of one prefill rank's KV heads)",
        check=_tp_compatible,
        cel="self.decode.tensorParallelSize >= self.prefill.tensorParallelSize"
        " && self.decode.tensorParallelSize % self.prefill.tensorParallelSize == 0",
    ),
    *(
        Rule(
            field=f"{role}.resources.gpus",
            message=f"kvTransfer.bufferDevice 'cuda' needs at least {role}.tensorParallelSize / "
            f"{role}.nodesPerReplica GPUs per pod (one per TP rank the pod runs)",
            check=_cuda_gpus(role),
            cel=_role_cel_gpus(role),
        )
        for role in ROLES
    ),
    Rule(
        field="kvTransfer.sideChannelPort",
        message="the side-channel ports (sideChannelPort .. sideChannelPort + max TP - 1) must not include engine.port",
        check=_ports_distinct,
        cel=f"self.engine.port < self.kvTransfer.sideChannelPort"
        f" || self.engine.port >= self.kvTransfer.sideChannelPort + {_MAX_TP_CEL}",
    ),
    Rule(
        field="kvTransfer.sideChannelPort",
        message=f"engine.port and the side-channel ports must not include {KV_EVENTS_PORTS[0]} or"
        f" {KV_EVENTS_PORTS[1]} (the engines' KV event ports)",
        check=_kv_events_ports_free,
        cel=f"self.engine.port != {KV_EVENTS_PORTS[0]} && self.engine.port != {KV_EVENTS_PORTS[1]}"
        f" && (self.kvTransfer.sideChannelPort > {KV_EVENTS_PORTS[1]}"
        f" || self.kvTransfer.sideChannelPort + {_MAX_TP_CEL} - 1 < {KV_EVENTS_PORTS[0]})",
    ),
    Rule(
        field="kvTransfer.sideChannelPort",
        message="sideChannelPort + max TP - 1 must be at most 65535 (one port per TP rank)",
        check=_side_channel_range,
        cel=f"self.kvTransfer.sideChannelPort + {_MAX_TP_CEL} - 1 <= 65535",
    ),
    Rule(
        field="network.rdma.count",
        message="must be at least 1 when network.rdma.resourceName is set",
        check=_rdma_count,
        cel="!has(self.network.rdma) || !has(self.network.rdma.resourceName) || self.network.rdma.count >= 1",
    ),
    Rule(
        field="model.source",
        message="set exactly one of pvc or hf",
        check=_one_model_source,
        cel="!has(self.model.source) || has(self.model.source.pvc) != has(self.model.source.hf)",
    ),
    Rule(
        field="engine.blockSize",
        message="CPU engines (resources.gpus: 0) need a block size that is a multiple of 32",
        check=_cpu_block_size,
        cel=f"!({_cpu_cel('prefill')} || {_cpu_cel('decode')}) || self.engine.blockSize % 32 == 0",
    ),
)


# --- autoscaling: bounds, ratio, planner ------------------------------------


def replica_range(role: RoleSpec) -> tuple[int, int]:
    """Replicas a role may have: its autoscaling bounds, else exactly its replicas."""
    a = role.autoscaling
    return (a.min_replicas, a.max_replicas) if a is not None else (role.replicas, role.replicas)


def ratio_bounds(spec: DisaggregatedInferenceSpec) -> tuple[Optional[float], Optional[float]]:
    r = spec.scaling.ratio
    return (r.min, r.max) if r is not None else (None, None)


def _bounds_ordered(role_name: str) -> Callable[[DisaggregatedInferenceSpec], bool]:
    def check(spec: DisaggregatedInferenceSpec) -> bool:
        a = spec.role(role_name).autoscaling
        return a is None or a.min_replicas <= a.max_replicas

    return check


def _ratio_ordered(spec: DisaggregatedInferenceSpec) -> bool:
    low, high = ratio_bounds(spec)
    return low is None or high is None or low <= high


def _ratio_reachable(spec: DisaggregatedInferenceSpec) -> bool:
    """Some real prefill/decode pair within the bounds meets the ratio (CEL can say this much)."""
    (p_min, p_max), (d_min, d_max) = replica_range(spec.prefill), replica_range(spec.decode)
    low, high = ratio_bounds(spec)
    return (low is None or p_max >= low * d_min - 1e-9) and (high is None or p_min <= high * d_max + 1e-9)


def ratio_satisfiable(spec: DisaggregatedInferenceSpec) -> bool:
    """Some whole-number prefill/decode pair within the bounds meets the ratio."""
    (p_min, p_max), (d_min, d_max) = replica_range(spec.prefill), replica_range(spec.decode)
    bounds = ratio_bounds(spec)
    for d in range(d_min, d_max + 1):
        low = p_min if bounds[0] is None else max(p_min, math.ceil(bounds[0] * d - 1e-9))
        high = p_max if bounds[1] is None else min(p_max, math.floor(bounds[1] * d + 1e-9))
        if low <= high:
            return True
    return False


def _has_front_end(spec: DisaggregatedInferenceSpec) -> bool:
    """A front end runs the serving pipeline, which splits requests by pair and writes their series:
    the router, the Endpoint Picker behind a Gateway, or both."""
    return spec.router.enabled or spec.gateway.inference_pool.enabled


_FRONT_END_CEL = "self.router.enabled || self.gateway.inferencePool.enabled"
_FRONT_END_NAMES = "router.enabled or gateway.inferencePool.enabled"


def _planner_has_router(spec: DisaggregatedInferenceSpec) -> bool:
    p = spec.scaling.planner
    return p is None or not p.enabled or _has_front_end(spec)


def _planner_has_target(spec: DisaggregatedInferenceSpec) -> bool:
    p = spec.scaling.planner
    return p is None or not p.enabled or any(spec.role(r).autoscaling is not None for r in ROLES)


def _range_cel(role: str) -> tuple[str, str]:
    a = f"self.{role}.autoscaling"
    return (f"double(has({a}) ? {a}.minReplicas : self.{role}.replicas)",
            f"double(has({a}) ? {a}.maxReplicas : self.{role}.replicas)")


_P_RANGE, _D_RANGE = _range_cel("prefill"), _range_cel("decode")
_PLANNER_ON_CEL = "has(self.scaling.planner) && self.scaling.planner.enabled"

SCALING_RULES: tuple[Rule, ...] = (
    *(
        Rule(
            field=f"{role}.autoscaling.minReplicas",
            message="must not be greater than maxReplicas",
            check=_bounds_ordered(role),
            cel=f"!has(self.{role}.autoscaling) || self.{role}.autoscaling.minReplicas <= self.{role}.autoscaling.maxReplicas",
        )
        for role in ROLES
    ),
    Rule(
        field="scaling.ratio.min",
        message="must not be greater than scaling.ratio.max",
        check=_ratio_ordered,
        cel="!has(self.scaling.ratio) || !has(self.scaling.ratio.min) || !has(self.scaling.ratio.max)"
        " || self.scaling.ratio.min <= self.scaling.ratio.max",
    ),
    Rule(
        field="scaling.ratio",
        message="no prefill and decode replicas within their bounds (autoscaling min/max, else replicas) "
        "give a prefill/decode ratio inside [min, max]",
        check=_ratio_reachable,
        cel="!has(self.scaling.ratio) || ("
        f"(!has(self.scaling.ratio.min) || {_P_RANGE[1]} >= self.scaling.ratio.min * {_D_RANGE[0]} - 0.000000001) && "
        f"(!has(self.scaling.ratio.max) || {_P_RANGE[0]} <= self.scaling.ratio.max * {_D_RANGE[1]} + 0.000000001))",
    ),
    Rule(
        field="scaling.planner.enabled",
        message=f"the planner reads the front ends' metrics: it needs {_FRONT_END_NAMES}",
        check=_planner_has_router,
        cel=f"!({_PLANNER_ON_CEL}) || {_FRONT_END_CEL}",
    ),
    Rule(
        field="scaling.planner.enabled",
        message="the planner sets scalers: set prefill.autoscaling or decode.autoscaling (or both)",
        check=_planner_has_target,
        cel=f"!({_PLANNER_ON_CEL}) || has(self.prefill.autoscaling) || has(self.decode.autoscaling)",
    ),
)
SPEC_RULES = SPEC_RULES + SCALING_RULES


# --- scale to zero as a P/D pair (issue 41) -----------------------------------------


def scale_to_zero_on(spec: DisaggregatedInferenceSpec) -> bool:
    s = spec.scaling.scale_to_zero
    return s is not None and s.enabled


def _pair_may_reach_zero(spec: DisaggregatedInferenceSpec) -> bool:
    """Both roles are written through their scalers, and the clamp lets both reach 0."""
    return not scale_to_zero_on(spec) or all(
        (a := spec.role(r).autoscaling) is not None and a.min_replicas == 0 for r in ROLES)


def _scale_to_zero_has_front_end(spec: DisaggregatedInferenceSpec) -> bool:
    return not scale_to_zero_on(spec) or _has_front_end(spec)


_STZ_ON_CEL = "has(self.scaling.scaleToZero) && self.scaling.scaleToZero.enabled"
SCALE_TO_ZERO_RULES: tuple[Rule, ...] = (
    Rule(
        field="scaling.scaleToZero.enabled",
        message="needs prefill.autoscaling and decode.autoscaling, both with minReplicas 0 (the pair is the unit: "
        "both scalers go to 0 and back to 1 together; an HPA or KEDA keeps its own minimum of 1 and more)",
        check=_pair_may_reach_zero,
        cel=f"!({_STZ_ON_CEL}) || (has(self.prefill.autoscaling) && self.prefill.autoscaling.minReplicas == 0"
        " && has(self.decode.autoscaling) && self.decode.autoscaling.minReplicas == 0)",
    ),
    Rule(
        field="scaling.scaleToZero.enabled",
        message=f"the front ends hold requests while the pair is at 0 and report them: it needs {_FRONT_END_NAMES}",
        check=_scale_to_zero_has_front_end,
        cel=f"!({_STZ_ON_CEL}) || {_FRONT_END_CEL}",
    ),
)
SPEC_RULES = SPEC_RULES + SCALE_TO_ZERO_RULES


# --- multi-node roles, gang scheduling, placement (issue 12) ------------------


def _tp_divides(role_name: str) -> Callable[[DisaggregatedInferenceSpec], bool]:
    def check(spec: DisaggregatedInferenceSpec) -> bool:
        role = spec.role(role_name)
        return role.tensor_parallel_size % role.nodes_per_replica == 0

    return check


def _required_placement_has_key(spec: DisaggregatedInferenceSpec) -> bool:
    return spec.placement.mode != "required" or spec.placement.topology_key is not None


def _gang_has_a_group(spec: DisaggregatedInferenceSpec) -> bool:
    """A gang is one replica's pods; a one-pod replica is a group of one, which no gang scheduler needs."""
    if spec.scheduling.gang.provider == "none":
        return True
    return any(spec.role(r).nodes_per_replica > 1 and spec.role(r).replicas > 0 for r in ROLES)


def _kueue_has_queue(spec: DisaggregatedInferenceSpec) -> bool:
    return spec.scheduling.gang.provider != "kueue" or spec.scheduling.queue_name is not None


TOPOLOGY_RULES: tuple[Rule, ...] = (
    *(
        Rule(
            field=f"{role}.nodesPerReplica",
            message=f"must divide {role}.tensorParallelSize evenly (every pod of a replica runs "
            f"tensorParallelSize / nodesPerReplica TP ranks)",
            check=_tp_divides(role),
            cel=f"self.{role}.tensorParallelSize % self.{role}.nodesPerReplica == 0",
        )
        for role in ROLES
    ),
    Rule(
        field="placement.topologyKey",
        message="is required when placement.mode is 'required' (the node label whose domain decode must share "
        "with prefill)",
        check=_required_placement_has_key,
        cel="self.placement.mode != 'required' || has(self.placement.topologyKey)",
    ),
    Rule(
        field="scheduling.gang.provider",
        message="a gang is the pods of one replica: it needs a role with nodesPerReplica > 1 and replicas >= 1 "
        "(with nodesPerReplica 1 every replica is a single pod and cannot form a group); set provider 'none'",
        check=_gang_has_a_group,
        cel="self.scheduling.gang.provider == 'none'"
        " || (self.prefill.nodesPerReplica > 1 && self.prefill.replicas > 0)"
        " || (self.decode.nodesPerReplica > 1 && self.decode.replicas > 0)",
    ),
    Rule(
        field="scheduling.queueName",
        message="is required with scheduling.gang.provider 'kueue' (Kueue admits only pods labelled with a "
        "LocalQueue)",
        check=_kueue_has_queue,
        cel="self.scheduling.gang.provider != 'kueue' || has(self.scheduling.queueName)",
    ),
)
SPEC_RULES = SPEC_RULES + TOPOLOGY_RULES


# --- the router's flow control (issue 22) --------------------------------------


def _priority_names_unique(spec: DisaggregatedInferenceSpec) -> bool:
    names = [p.name for p in spec.router.flow_control.priorities]
    return len(names) == len(set(names))


def _flow_headers_differ(spec: DisaggregatedInferenceSpec) -> bool:
    fc = spec.router.flow_control
    return fc.tenant_header != fc.priority_header  # both lower case (types.HEADER_NAME)


_FC = "self.router.flowControl"
FLOW_CONTROL_RULES: tuple[Rule, ...] = (
    Rule(
        field="router.flowControl.priorities",
        message="names must be unique (a class is selected by its name)",
        check=_priority_names_unique,
        cel=f"!has({_FC}.priorities)"
        f" || {_FC}.priorities.all(p, {_FC}.priorities.filter(q, q.name == p.name).size() == 1)",
    ),
    Rule(
        field="router.flowControl.priorityHeader",
        message="must differ from tenantHeader",
        check=_flow_headers_differ,
        cel=f"{_FC}.tenantHeader != {_FC}.priorityHeader",
    ),
)
SPEC_RULES = SPEC_RULES + FLOW_CONTROL_RULES


# --- conditional disaggregation (issue 32) ------------------------------------------


def _min_remote_prefill_fits(spec: DisaggregatedInferenceSpec) -> bool:
    d, limit = spec.router.disaggregation, spec.model.max_model_len
    return d.policy != routing.DISAGGREGATION_CONDITIONAL or limit is None or d.min_remote_prefill_tokens < limit


_DIS = "self.router.disaggregation"
DISAGGREGATION_RULES: tuple[Rule, ...] = (
    Rule(
        field="router.disaggregation.minRemotePrefillTokens",
        message="must be below model.maxModelLen under policy 'Conditional' (no prompt is that long: no request "
        "would ever be prefilled remotely; use policy 'Always' or a smaller value)",
        check=_min_remote_prefill_fits,
        cel=f"{_DIS}.policy != '{routing.DISAGGREGATION_CONDITIONAL}' || !has(self.model.maxModelLen)"
        f" || {_DIS}.minRemotePrefillTokens < self.model.maxModelLen",
    ),
)
SPEC_RULES = SPEC_RULES + DISAGGREGATION_RULES


# --- prefix scoring over KV tiers (issue 40) ----------------------------------------


def _some_tier_weighs(spec: DisaggregatedInferenceSpec) -> bool:
    w = spec.router.prefix_scoring.tier_weights
    return w.gpu > 0 or w.cpu > 0 or w.storage > 0


_TW = "self.router.prefixScoring.tierWeights"
PREFIX_SCORING_RULES: tuple[Rule, ...] = (
    Rule(
        field="router.prefixScoring.tierWeights",
        message="at least one tier's weight must be above 0 (a tier at 0 is left out of the router's index)",
        check=_some_tier_weighs,
        # double(): a weight written as an integer (0, 1) compares as a number either way
        cel=f"double({_TW}.GPU) > 0.0 || double({_TW}.CPU) > 0.0 || double({_TW}.STORAGE) > 0.0",
    ),
)
SPEC_RULES = SPEC_RULES + PREFIX_SCORING_RULES


# --- the KV offload tier (issue 40) ---------------------------------------------------


def _offload_block_multiple(spec: DisaggregatedInferenceSpec) -> bool:
    o = spec.kv_offload
    return o is None or o.block_size is None or o.block_size % spec.engine.block_size == 0


def _offload_roles_unique(spec: DisaggregatedInferenceSpec) -> bool:
    return spec.kv_offload is None or len(set(spec.kv_offload.roles)) == len(spec.kv_offload.roles)


def _offload_fits_memory(role_name: str) -> Callable[[DisaggregatedInferenceSpec], bool]:
    def check(spec: DisaggregatedInferenceSpec) -> bool:
        o, memory = spec.kv_offload, spec.role(role_name).resources.memory
        if o is None or role_name not in o.roles or memory is None:
            return True
        try:
            return quantity.parse(memory) > quantity.parse(o.cpu.capacity)
        except quantity.BadQuantity:
            return True  # refused by its own field's rule

    return check


_KVO = "self.kvOffload"
KV_OFFLOAD_RULES: tuple[Rule, ...] = (
    Rule(
        field="kvOffload.blockSize",
        message="must be a multiple of engine.blockSize (an offloaded chunk is whole engine blocks)",
        check=_offload_block_multiple,
        cel=f"!has({_KVO}) || !has({_KVO}.blockSize) || {_KVO}.blockSize % self.engine.blockSize == 0",
    ),
    Rule(
        field="kvOffload.roles",
        message="must not name a role twice",
        check=_offload_roles_unique,
        cel=f"!has({_KVO}) || !has({_KVO}.roles) || {_KVO}.roles.all(r, {_KVO}.roles.filter(q, q == r).size() == 1)",
    ),
    *(
        Rule(
            field=f"{role}.resources.memory",
            message="must be above kvOffload.cpu.capacity when the role has the offload tier (the tier is host "
            "memory of the engine's own pod)",
            check=_offload_fits_memory(role),
            cel=f"!has({_KVO}) || (has({_KVO}.roles) && !({_KVO}.roles.exists(r, r == '{role}')))"
            f" || !has(self.{role}.resources.memory) || !isQuantity(self.{role}.resources.memory)"
            f" || !isQuantity({_KVO}.cpu.capacity)"
            f" || quantity(self.{role}.resources.memory).isGreaterThan(quantity({_KVO}.cpu.capacity))",
        )
        for role in ROLES
    ),
)
SPEC_RULES = SPEC_RULES + KV_OFFLOAD_RULES


# --- canary rollouts (issue 22) ---------------------------------------------------


def _canary_has_steps(spec: DisaggregatedInferenceSpec) -> bool:
    return spec.rollout.strategy != "Canary" or spec.rollout.canary is not None


def _canary_has_router(spec: DisaggregatedInferenceSpec) -> bool:
    return spec.rollout.strategy != "Canary" or _has_front_end(spec)


def _canary_weights_increase(spec: DisaggregatedInferenceSpec) -> bool:
    c = spec.rollout.canary
    weights = [s.weight for s in c.steps] if c is not None else []
    return all(a < b for a, b in zip(weights, weights[1:]))


_CANARY = "self.rollout.canary"
CANARY_RULES: tuple[Rule, ...] = (
    Rule(
        field="rollout.canary",
        message="is required with rollout.strategy 'Canary' (its steps say how the new pair's share grows)",
        check=_canary_has_steps,
        cel=f"self.rollout.strategy != 'Canary' || has({_CANARY})",
    ),
    Rule(
        field="rollout.strategy",
        message=f"'Canary' needs {_FRONT_END_NAMES}: a front end splits the requests and measures each pair",
        check=_canary_has_router,
        cel=f"self.rollout.strategy != 'Canary' || {_FRONT_END_CEL}",
    ),
    Rule(
        field="rollout.canary.steps",
        message="weights must strictly increase from one step to the next",
        check=_canary_weights_increase,
        cel=f"!has({_CANARY}) || ({_CANARY}.steps.map(s, s.weight).isSorted()"
        f" && {_CANARY}.steps.all(s, {_CANARY}.steps.filter(t, t.weight == s.weight).size() == 1))",
    ),
)
SPEC_RULES = SPEC_RULES + CANARY_RULES


# --- behind a Gateway: the InferencePool and its Endpoint Picker (issue 29) ---------------------


def _epp_ports_differ(spec: DisaggregatedInferenceSpec) -> bool:
    return spec.gateway.inference_pool.epp_port != gateway.EPP_METRICS


def _peers_well_formed(spec: DisaggregatedInferenceSpec) -> bool:
    """As the API server's NetworkPolicy validation: a peer selects something, and ipBlock stands alone."""
    for p in spec.gateway.inference_pool.allow_from:
        selectors = p.pod_selector is not None or p.namespace_selector is not None
        if not (selectors or p.ip_block is not None) or (selectors and p.ip_block is not None):
            return False
    return True



def _gateway_peers_named(spec: DisaggregatedInferenceSpec) -> bool:
    """Secure by default: the gateway's way to decode is opened only to the peers the spec names."""
    pool = spec.gateway.inference_pool
    return not (pool.enabled and spec.network.network_policy) or bool(pool.allow_from)


def _open_epp_is_fenced(spec: DisaggregatedInferenceSpec) -> bool:
    """An Endpoint Picker that checks no caller is reachable only from the peers the spec names."""
    pool = spec.gateway.inference_pool
    return (not pool.enabled or pool.caller_auth != gateway.CALLER_AUTH_NONE
            or (spec.network.network_policy and bool(pool.allow_from)))


_POOL = "self.gateway.inferencePool"
GATEWAY_RULES: tuple[Rule, ...] = (
    Rule(
        field="gateway.inferencePool.callerAuth",
        message=f"'{gateway.CALLER_AUTH_NONE}' needs network.networkPolicy: true and allowFrom: with no caller token, "
        "the NetworkPolicy is all that keeps other pods from the Endpoint Picker (which hands out the engine token)",
        check=_open_epp_is_fenced,
        cel=f"!{_POOL}.enabled || {_POOL}.callerAuth != '{gateway.CALLER_AUTH_NONE}' || (self.network.networkPolicy"
        f" && has({_POOL}.allowFrom) && size({_POOL}.allowFrom) > 0)",
    ),
    Rule(
        field="gateway.inferencePool.eppPort",
        message=f"must not be {gateway.EPP_METRICS}: the Endpoint Picker serves /health and /metrics there",
        check=_epp_ports_differ,
        cel=f"{_POOL}.eppPort != {gateway.EPP_METRICS}",
    ),
    Rule(
        field="gateway.inferencePool.allowFrom",
        message="each peer sets podSelector and/or namespaceSelector, or ipBlock alone",
        check=_peers_well_formed,
        cel=f"!has({_POOL}.allowFrom) || {_POOL}.allowFrom.all(p, has(p.ipBlock)"
        " ? !(has(p.podSelector) || has(p.namespaceSelector)) : (has(p.podSelector) || has(p.namespaceSelector)))",
    ),
    Rule(
        field="gateway.inferencePool.allowFrom",
        message="is required with enabled and network.networkPolicy: name the gateway's proxies, which reach the "
        "decode pods' engine port (e.g. a namespaceSelector of their namespace; namespaceSelector: {} admits every "
        "namespace)",
        check=_gateway_peers_named,
        cel=f"!{_POOL}.enabled || !self.network.networkPolicy || (has({_POOL}.allowFrom) && size({_POOL}.allowFrom) > 0)",
    ),
)
SPEC_RULES = SPEC_RULES + GATEWAY_RULES


def _fail_open_acknowledged(spec: DisaggregatedInferenceSpec) -> bool:
    """The engines answer only the fleet's token, which the gateway's FailOpen fallback cannot carry: FailOpen
    would answer 401 while the picker is down, unless the user says the gateway sets the token itself."""
    pool = spec.gateway.inference_pool
    return not (pool.enabled and pool.failure_mode == gateway.FAIL_OPEN) or pool.fail_open_without_engine_token


FAIL_OPEN_RULES: tuple[Rule, ...] = (
    Rule(
        field="gateway.inferencePool.failureMode",
        message=f"{gateway.FAIL_OPEN} needs failOpenWithoutEngineToken: true: while the Endpoint Picker is down the "
        "gateway sends requests to decode without the fleet's engine API token, and the engines refuse them (401) "
        f"unless your gateway sets the token itself; use {gateway.FAIL_CLOSE} with eppReplicas >= 2, or set "
        "failOpenWithoutEngineToken to say the gateway sets it",
        check=_fail_open_acknowledged,
        cel=f"!{_POOL}.enabled || {_POOL}.failureMode != '{gateway.FAIL_OPEN}' || {_POOL}.failOpenWithoutEngineToken",
    ),
)
SPEC_RULES = SPEC_RULES + FAIL_OPEN_RULES


def vllm_flag_name(arg: str) -> Optional[str]:
    """The flag an argument sets as vLLM's parser reads it (FlexibleArgumentParser), or None for a value:
    ``--a_b=1`` and ``--a-b.c`` are ``--a-b`` (underscores become dashes, a dotted key sets a JSON field)."""
    if not arg.startswith("-") or arg in ("-", "--") or arg[1:2].isdigit():
        return None
    name = arg.split("=", 1)[0]
    if name.startswith("--"):
        return "--" + name[2:].split(".", 1)[0].replace("_", "-")
    return name.split(".", 1)[0]


def owned_flag(arg: str) -> Optional[str]:
    """The owned flag an extraArgs entry would set, in any spelling vLLM accepts, or None."""
    name = vllm_flag_name(arg)
    if name is None:
        return None
    if name in OWNED_SHORT_FLAGS:
        return OWNED_SHORT_FLAGS[name]
    if name in OWNED_FLAGS:
        return name
    if name.startswith("--") and len(name) - 2 >= _MIN_ABBREV:
        prefixed = [f for f in OWNED_FLAGS if f.startswith(name)]
        if prefixed:  # an abbreviation argparse would expand to an owned flag
            return prefixed[0]
    return None


def _owned_flag(arg: str) -> Optional[str]:
    return owned_flag(arg)


def operator_only_errors(spec: DisaggregatedInferenceSpec) -> list[FieldError]:
    """Rules the CRD cannot express; the operator reports them as InvalidSpec."""
    errors: list[FieldError] = []
    arg_lists = [("engine.extraArgs", spec.engine.extra_args)]
    arg_lists += [(f"{r}.extraArgs", spec.role(r).extra_args) for r in ROLES]
    for path, args in arg_lists:
        for i, arg in enumerate(args):
            flag = _owned_flag(arg)
            if flag:
                errors.append(
                    FieldError(f"spec.{path}[{i}]", f"{arg.split('=', 1)[0]!r} sets {flag}, which pdfleet sets from "
                               "the spec; remove it from extraArgs")
                )
    for path, env in [("engine.env", spec.engine.env)] + [(f"{r}.env", spec.role(r).env) for r in ROLES]:
        for i, var in enumerate(env):
            if var.name == env_names.VLLM_API_KEY:
                errors.append(FieldError(f"spec.{path}[{i}].name", f"{env_names.VLLM_API_KEY} is set by pdfleet from "
                                         "the fleet's generated Secret (the engines answer only the fleet)"))
    if spec.network.network_policy:
        env_lists = [("engine.env", spec.engine.env)] + [(f"{r}.env", spec.role(r).env) for r in ROLES]
        for path, env in env_lists:
            for i, var in enumerate(env):
                if var.name == UCX_TCP_PORT_RANGE_VAR and parse_port_range(var.value or "") is None:
                    errors.append(FieldError(f"spec.{path}[{i}].value", f"{UCX_TCP_PORT_RANGE_VAR} must be FIRST-LAST "
                                             "(ports 1-65535) while network.networkPolicy is on: the policy opens "
                                             "those ports for UCX's TCP transport"))
    for role in ROLES:
        for key in spec.role(role).pod_labels:
            if key.startswith(RESERVED_LABEL_PREFIXES):
                errors.append(
                    FieldError(
                        f"spec.{role}.podLabels.{key}",
                        f"labels under {' and '.join(RESERVED_LABEL_PREFIXES)} are set by pdfleet",
                    )
                )
    if _ratio_reachable(spec) and not ratio_satisfiable(spec):
        errors.append(FieldError("spec.scaling.ratio", "no whole numbers of prefill and decode replicas within "
                                 "their bounds give a prefill/decode ratio inside [min, max]"))
    return errors


def spec_errors(spec: DisaggregatedInferenceSpec) -> list[FieldError]:
    """Every cross-field problem of a spec that parsed, in a stable order."""
    errors = [FieldError(rule.spec_field, rule.message) for rule in SPEC_RULES if not rule.check(spec)]
    return errors + operator_only_errors(spec)
