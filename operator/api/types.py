"""DisaggregatedInference v1alpha1: the API types.

These pydantic models are the single source of truth: the CRD in crds/ and the
chart's copy are generated from them (`pdfleet crd`), and the operator, the
plan and `pdfleet local` all parse resources through them. Field names are the
Kubernetes (camelCase) names; Python attributes are snake_case.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, model_validator
from pydantic_core import PydanticCustomError
from pydantic.alias_generators import to_camel

from pdfleet.contract import kv_tiers, ports, routing
from pdfleet.contract import gateway
from pdfleet.contract.connector_config import DEFAULTS as CONNECTOR_DEFAULTS, GPU_NIXL_THREADS, MAX_NIXL_THREADS
from pdfleet.contract.flow_control import FAIRNESS_COST, FAIRNESS_REQUESTS
from pdfleet.operator.api import cidr, quantity

GROUP = "pdfleet.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DisaggregatedInference"
PLURAL = "disaggregatedinferences"
SINGULAR = "disaggregatedinference"
SHORT_NAMES = ["dinf"]
CATEGORIES = ["pdfleet", "inference"]

# The fleet's child names append "-prefill-<revision>" and StatefulSet pods add
# "-<ordinal>" plus a controller-revision-hash label: 40 keeps them within 63.
MAX_NAME_LENGTH = 40
# spec.progressDeadlineSeconds' default: a large model's download and load on a slow link (issue 39)
DEFAULT_PROGRESS_DEADLINE_SECONDS = 1800
MAX_PROGRESS_DEADLINE_SECONDS = 7 * 24 * 3600
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
DNS1035_LABEL = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"
QUANTITY = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
EXTENDED_RESOURCE = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
ENV_NAME = r"^[-._a-zA-Z][-._a-zA-Z0-9]*$"

ObjectName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=DNS1123_SUBDOMAIN)]
Quantity = Annotated[str, StringConstraints(pattern=QUANTITY)]
Port = Annotated[int, Field(ge=1, le=65535)]
Replicas = Annotated[int, Field(ge=0, le=1000)]


class Model(BaseModel):
    """Base for every API type: camelCase on the wire, unknown fields refused."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)


class SecretKeyRef(Model):
    name: ObjectName = Field(description="Name of a Secret in the resource's namespace.")
    key: Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z0-9]+$")] = Field(
        description="Key inside the Secret."
    )


class LocalObjectReference(Model):
    name: ObjectName = Field(description="Name of an object in the resource's namespace.")


class PVCSource(Model):
    claim_name: ObjectName = Field(description="PersistentVolumeClaim holding the model; mounted read-only at /models.")
    sub_path: Optional[str] = Field(default=None, description="Path inside the claim to mount.")


class HFSource(Model):
    token_secret_ref: Optional[SecretKeyRef] = Field(
        default=None, description="Secret key holding a Hugging Face token (exposed to vLLM as HF_TOKEN)."
    )
    revision: Optional[str] = Field(default=None, description="Model revision (branch, tag or commit) to download.")


class ModelSource(Model):
    """Where the weights come from: exactly one of pvc or hf."""

    pvc: Optional[PVCSource] = Field(default=None, description="Weights on a PersistentVolumeClaim (no download).")
    hf: Optional[HFSource] = Field(default=None, description="Weights downloaded from the Hugging Face Hub.")


class ModelSpec(Model):
    name: Annotated[str, StringConstraints(min_length=1, max_length=512)] = Field(
        description="Hugging Face model id, or a path inside the pod (e.g. /models/llama under a pvc source)."
    )
    served_model_name: Optional[Annotated[str, StringConstraints(min_length=1, max_length=253)]] = Field(
        default=None, description="Name clients use in requests; defaults to name."
    )
    source: Optional[ModelSource] = Field(
        default=None, description="Where the weights come from (pvc or hf); unset: vLLM downloads name from the Hub."
    )
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        default="auto", description="Weight and activation dtype (vLLM --dtype); auto: the model's own."
    )
    max_model_len: Optional[Annotated[int, Field(ge=16, le=10_000_000)]] = Field(
        default=None, description="Longest prompt plus output in tokens (vLLM --max-model-len); unset: the model's."
    )


class EnvVar(Model):
    name: Annotated[str, StringConstraints(min_length=1, max_length=256, pattern=ENV_NAME)] = Field(
        description="Environment variable name."
    )
    value: str = Field(default="", description="Its value (a literal string).")


class Resources(Model):
    gpus: Optional[Annotated[int, Field(ge=0, le=64)]] = Field(
        default=None, description="nvidia.com/gpu per pod; defaults to tensorParallelSize."
    )
    cpu: Optional[Quantity] = Field(default=None, description="CPU request and limit per pod (a quantity, e.g. 8).")
    memory: Optional[Quantity] = Field(
        default=None, description="Memory request and limit per pod (a quantity, e.g. 64Gi)."
    )


class Toleration(Model):
    key: Optional[str] = Field(default=None, description="Taint key to tolerate; unset with Exists: every taint.")
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Equal: key and value match; Exists: key.")
    value: Optional[str] = Field(default=None, description="Taint value to match (operator Equal).")
    effect: Optional[Literal["NoSchedule", "PreferNoSchedule", "NoExecute"]] = Field(
        default=None, description="Taint effect to match; unset: every effect."
    )
    toleration_seconds: Optional[int] = Field(
        default=None, description="NoExecute only: how long the pod stays on a node after the taint appears."
    )


class AutoscalingSpec(Model):
    """Bounds of a role's scale target (a DisaggregatedInferenceScaler named <fleet>-<role>)."""

    min_replicas: Replicas = Field(default=1, description="Fewest replicas any scaler value is clamped to.")
    max_replicas: Replicas = Field(description="Most replicas any scaler value is clamped to.")


class RoleSpec(Model):
    """One side of the fleet; prefill and decode have the same shape."""

    replicas: Replicas = Field(
        default=1, description="Replicas; with autoscaling set, only the starting size of the role's scaler."
    )
    autoscaling: Optional[AutoscalingSpec] = Field(
        default=None, description="Scale this role through its DisaggregatedInferenceScaler (HPA, KEDA, planner)."
    )
    tensor_parallel_size: Annotated[int, Field(ge=1, le=64)] = Field(
        default=1, description="Tensor-parallel ranks per replica (vLLM --tensor-parallel-size)."
    )
    resources: Resources = Field(
        default_factory=Resources, description="Per-pod GPUs, CPU and memory; gpus: 0 runs CPU engines."
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Node labels this role's pods need.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Taints this role's pods tolerate.")
    affinity: Optional[dict[str, Any]] = Field(default=None, description="A core/v1 Affinity, passed through.")
    extra_args: list[str] = Field(default_factory=list, description="Extra vLLM arguments for this role only.")
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment of this role's engine container.")
    pod_annotations: dict[str, str] = Field(default_factory=dict, description="Annotations on this role's pods.")
    pod_labels: dict[str, str] = Field(
        default_factory=dict, description="Labels on this role's pods (not under pdfleet.io/ or app.kubernetes.io/)."
    )
    nodes_per_replica: Annotated[int, Field(ge=1, le=64)] = Field(
        default=1,
        description="Pods (nodes) one replica spans; above 1 the role runs as a LeaderWorkerSet and "
        "tensorParallelSize is split evenly over them.",
    )


class EngineSpec(Model):
    port: Port = Field(default=ports.ENGINE_HTTP, description="vLLM's HTTP port inside prefill and decode pods.")
    block_size: Annotated[int, Field(ge=1, le=1024)] = Field(
        default=16, description="Tokens per KV block; CPU engines need a multiple of 32."
    )
    extra_args: list[str] = Field(default_factory=list, description="Extra vLLM arguments for both roles.")
    env: list[EnvVar] = Field(default_factory=list, description="Extra environment of both roles' engine containers.")


class DecodeReuseSpec(Model):
    """Decode's KV reused by the next turn's prefill (issue 40): a P/D turn's decode keeps its blocks, prompt and
    generated tokens, under a lease, and the conversation's next turn's prefill pulls the ones its prompt starts
    with instead of recomputing them. Both roles' engines then run pdfleet's connector as kv_both."""

    enabled: bool = Field(default=False, description="Hold each P/D turn's KV on its decode for the next turn.")
    min_reusable_tokens: Annotated[int, Field(ge=0, le=1_000_000)] = Field(
        default=256,
        description="Fewest tokens the next turn's prefill must be able to pull from the decode (past what it has "
        "cached itself); below, it recomputes them and the decode's hold is released at once.",
    )


class KVTransferSpec(Model):
    backends: Annotated[
        list[Annotated[str, StringConstraints(pattern=r"^[A-Z][A-Z0-9_]*$")]], Field(min_length=1, max_length=8)
    ] = Field(default=list(CONNECTOR_DEFAULTS.backends), description="NIXL backends, in order of preference.")
    buffer_device: Literal["cuda", "cpu"] = Field(
        default="cuda", description="Where the transferred KV lives: GPU memory, or a host buffer."
    )
    side_channel_port: Port = Field(
        default=ports.SIDE_CHANNEL, description="Handshake (ZMQ) port of TP rank 0; rank r listens on port + r."
    )
    lease_seconds: Annotated[int, Field(ge=1, le=3600)] = Field(
        default=int(CONNECTOR_DEFAULTS.lease_seconds),
        description="How long prefill holds a request's blocks for decode to read.",
    )
    auth_secret_ref: Optional[SecretKeyRef] = Field(
        default=None,
        description="Secret key holding the shared side-channel key. Unset: the operator generates one per fleet"
        " (Secret <name>-kv-auth); the side channel is always signed.",
    )
    load_failure_policy: Literal["recompute", "fail"] = Field(
        default="recompute",
        description="When decode cannot pull a request's KV: recompute the prompt on decode, or fail the request.",
    )
    nixl_threads: Optional[Annotated[int, Field(ge=0, le=MAX_NIXL_THREADS)]] = Field(
        default=None,
        description="Threads with which decode posts one KV read's descriptors at once, each with its own UCX worker"
        f" (on a GPU, its own CUDA stream). Unset: {GPU_NIXL_THREADS} with bufferDevice cuda, 0 with cpu.",
    )
    decode_reuse: DecodeReuseSpec = Field(
        default_factory=DecodeReuseSpec,
        description="Decode's KV reused by the next turn's prefill (off by default): a turn's decode holds its blocks"
        " for the conversation's next turn (the router keys conversations as for a canary: x-session-id, "
        "prompt_cache_key, user, else the first turn), held under the lease (leaseSeconds) and at most half the "
        "decode's KV blocks, oldest released first. Non-streamed answers only.",
    )



def _capacity(value: str) -> str:
    try:
        ok = quantity.parse(value) >= 1
    except quantity.BadQuantity as exc:
        raise PydanticCustomError("quantity", str(exc)) from None
    if not ok:
        raise PydanticCustomError("quantity", "must be a positive quantity of at least 1 (bytes), e.g. 16Gi")
    return value


# Checked here (quantity.py) and by the CRD with Kubernetes' CEL quantity library, in the same words.
Capacity = Annotated[str, StringConstraints(max_length=64, pattern=QUANTITY), AfterValidator(_capacity), Field(json_schema_extra={"x-kubernetes-validations": [{
    "rule": "isQuantity(self) && !quantity(self).isLessThan(quantity('1'))",
    "message": "must be a positive quantity of at least 1 (bytes), e.g. 16Gi"}]})]
OffloadRole = Literal["prefill", "decode"]


class KVOffloadCPUSpec(Model):
    capacity: Capacity = Field(
        description="Host memory per engine (all its TP ranks together) that holds KV blocks the engine evicts, "
        "a quantity (e.g. 16Gi). It is taken from the engine pod's own memory: set resources.memory above it.")


class KVOffloadSpec(Model):
    """A second KV tier under each engine (issue 40): blocks the engine's KV cache evicts are kept in host memory
    by vLLM's OffloadingConnector (beside pdfleet's connector under vLLM's MultiConnector) and loaded back, not
    recomputed, when a later prompt starts with them; the router scores them by prefixScoring.tierWeights.CPU."""

    cpu: KVOffloadCPUSpec = Field(description="The host-memory tier.")
    roles: Annotated[list[OffloadRole], Field(min_length=1, max_length=2)] = Field(
        default_factory=lambda: ["prefill", "decode"], description="The roles whose engines get the tier.")
    block_size: Optional[Annotated[int, Field(ge=1, le=65536)]] = Field(
        default=None, description="Tokens per offloaded chunk, a multiple of engine.blockSize; unset: the "
        "engine's block size (one chunk per block).")

class RDMASpec(Model):
    resource_name: Optional[Annotated[str, StringConstraints(max_length=253, pattern=EXTENDED_RESOURCE)]] = Field(
        default=None, description="Device-plugin resource such as rdma/ib or rdma/hca_shared_devices_a."
    )
    count: Annotated[int, Field(ge=0, le=64)] = Field(default=1, description="RDMA devices per pod.")
    devices: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.:-]+$")]] = Field(
        default_factory=list, description="UCX_NET_DEVICES entries, e.g. mlx5_0:1."
    )
    multus_networks: list[Annotated[str, StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9./@]*[a-z0-9])?$")]] = Field(
        default_factory=list, description="NetworkAttachmentDefinitions for the Multus annotation."
    )


class PreflightSpec(Model):
    enabled: bool = Field(
        default=True,
        description="Before an engine starts, check in its pod that UCX sees the requested transports and that a "
        "loopback NIXL READ reaches minGBps; the result is the KVTransport condition.",
    )
    min_g_bps: Annotated[float, Field(ge=0, le=10_000)] = Field(
        default=0, alias="minGBps", description="Slowest acceptable loopback READ, in GB/s (0: no floor)."
    )


class NetworkSpec(Model):
    rdma: Optional[RDMASpec] = Field(
        default=None, description="RDMA devices the engine pods request; unset: UCX uses what it finds (e.g. TCP)."
    )
    preflight: PreflightSpec = Field(
        default_factory=PreflightSpec, description="The fabric check each engine pod runs before vLLM starts."
    )
    ucx_transports: list[Annotated[str, StringConstraints(pattern=r"^\^?[a-z0-9_]+$")]] = Field(
        default_factory=list, description="UCX_TLS entries, e.g. rc, ud, cuda_copy, tcp."
    )
    host_network: bool = Field(default=False, description="Run engine pods in the node's network namespace.")
    network_policy: bool = Field(
        default=True, description="Allow only the fleet's pods and its router to reach http and side-channel ports."
    )


class GangSpec(Model):
    provider: Literal["none", "kueue", "volcano", "coscheduling"] = Field(
        default="none", description="Who starts each multi-node replica's pods together or not at all."
    )


class SchedulingSpec(Model):
    gang: GangSpec = Field(default_factory=GangSpec, description="Gang scheduling of multi-node replicas.")
    queue_name: Optional[Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=DNS1123_SUBDOMAIN)]] = (
        Field(default=None, description="Kueue LocalQueue, or Volcano queue, the fleet's pods are admitted through.")
    )


class PlacementSpec(Model):
    topology_key: Optional[Annotated[str, StringConstraints(min_length=1, max_length=316)]] = Field(
        default=None,
        description="Node label whose value is one fast-fabric domain (an NVLink clique, a rack, a zone): decode "
        "pods go where prefill pods are.",
    )
    mode: Literal["preferred", "required"] = Field(
        default="preferred", description="Whether decode must (required) or should (preferred) share the domain."
    )


# RFC 9110 token characters, lower case (header names are case-insensitive; HTTP/2 sends them lower case).
HEADER_NAME = r"^[-a-z0-9!#$%&'*+.^_`|~]+$"
HeaderName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=HEADER_NAME)]


PriorityName = Annotated[str, StringConstraints(min_length=1, max_length=253,
                                               pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")]


class PriorityClass(Model):
    name: PriorityName = Field(
        description="The value of priorityHeader that selects this class (e.g. an InferenceObjective's name)."
    )
    weight: Annotated[int, Field(ge=1, le=1000)] = Field(
        default=1,
        description="Rank and share: higher weight is higher priority (shed last); classes waiting together are "
        "dispatched in proportion to their weights.",
    )


class FlowControlSpec(Model):
    """Overload protection in the router: a bounded queue with priorities and per-tenant fairness."""

    enabled: bool = Field(default=False, description="Off: the router forwards every request at once (no queue).")
    max_queue_seconds: Annotated[float, Field(ge=0.1, le=3600)] = Field(
        default=30, description="A request queued this long is refused with 429 and Retry-After."
    )
    max_queued_requests: Annotated[int, Field(ge=1, le=1_000_000)] = Field(
        default=1000, description="Requests the router holds at most; past it the lowest priority is shed (429)."
    )
    max_in_flight_per_decode: Annotated[int, Field(ge=1, le=100_000)] = Field(
        default=32,
        description="Requests the router lets run at once per ready decode endpoint (from the first leg to the last "
        "byte); more wait in its queue. Set near the engines' max-num-seqs.",
    )
    tenant_header: HeaderName = Field(
        default="x-gateway-inference-fairness-id",
        description="Request header naming the tenant (flow); the tenants of a class share by fairness.",
    )
    priority_header: HeaderName = Field(
        default="x-gateway-inference-objective",
        description="Request header naming the priority class; unknown or missing: the lowest class.",
    )
    priorities: Annotated[list[PriorityClass], Field(max_length=16)] = Field(
        default_factory=list, description="Priority classes; empty: one class for every request."
    )
    fairness: Literal[FAIRNESS_COST, FAIRNESS_REQUESTS] = Field(
        default=FAIRNESS_COST,
        description=f"What the tenants of a class (and the classes) share. {FAIRNESS_COST}: estimated "
        "tokens (prompt tokens + max_tokens per request), so a tenant asking 4 times the tokens per request gets a "
        f"quarter of the requests and about the same decode time; {FAIRNESS_REQUESTS}: requests "
        "(round robin, whatever they ask).",
    )


RoutingPolicy = Literal[routing.PREFIX_AWARE, routing.LEAST_OUTSTANDING]


class DisaggregationSpec(Model):
    """Per request, whether the router sends the prompt to a prefill first or decode computes it alone."""

    policy: Literal[routing.DISAGGREGATION_ALWAYS, routing.DISAGGREGATION_CONDITIONAL] = Field(
        default=routing.DISAGGREGATION_ALWAYS,
        description=f"{routing.DISAGGREGATION_ALWAYS}: every request prefill then decode (decode alone only for "
        f"n > 1 or several prompts). {routing.DISAGGREGATION_CONDITIONAL}: decode alone when a remote prefill does "
        "not pay: a prompt under one KV block, one whose tokens not cached on the chosen decode are fewer than "
        "minRemotePrefillTokens, or one that finds every prefill busy (prefillBusyInFlight) and the decode less so.",
    )
    min_remote_prefill_tokens: Annotated[int, Field(ge=0, le=1_000_000)] = Field(
        default=128,
        description="Conditional: prompts with fewer tokens not already cached on the chosen decode are computed on "
        "decode (at least one KV block is always required for a remote prefill).",
    )
    prefill_busy_in_flight: Annotated[int, Field(ge=1, le=100_000)] = Field(
        default=4,
        description="Conditional: when every ready prefill has at least this many legs in flight and the chosen "
        "decode has fewer requests in flight than the least loaded prefill, decode computes the prompt.",
    )


TierWeight = Annotated[float, Field(ge=0, le=1)]


class TierWeightsSpec(Model):
    """A cached block's worth to the router by the best KV tier holding it (the media of vLLM's KV events)."""

    gpu: TierWeight = Field(default=dict(kv_tiers.DEFAULT_TIER_WEIGHTS)[kv_tiers.MEDIUM_GPU],
                            alias=kv_tiers.MEDIUM_GPU, description="The engine's own KV cache.")
    cpu: TierWeight = Field(default=dict(kv_tiers.DEFAULT_TIER_WEIGHTS)[kv_tiers.MEDIUM_CPU],
                            alias=kv_tiers.MEDIUM_CPU, description="The offloading connector's host-memory tier.")
    storage: TierWeight = Field(default=dict(kv_tiers.DEFAULT_TIER_WEIGHTS)[kv_tiers.MEDIUM_STORAGE],
                                alias=kv_tiers.MEDIUM_STORAGE, description="The offloading connector's storage tier.")


class PrefixScoringSpec(Model):
    """How prefixAware scores a cached prompt prefix."""

    tier_weights: TierWeightsSpec = Field(
        default_factory=TierWeightsSpec,
        description="Each block of a cached prefix counts its tokens times the weight of the best tier holding it, "
        "each weight in [0, 1]; 0 leaves that tier out of the router's index (at least one above 0).",
    )


class RouterSpec(Model):
    enabled: bool = Field(
        default=True, description="Run the P/D router (Deployment and Service <name>-router) in front of the fleet."
    )
    replicas: Replicas = Field(default=1, description="Router replicas.")
    port: Port = Field(default=ports.ROUTER_HTTP, description="The router's HTTP port (container and Service).")
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field(
        default="ClusterIP", description="Type of the router's Service."
    )
    prefill_policy: RoutingPolicy = Field(
        default=routing.PREFIX_AWARE,
        description=f"How the router picks a prefill: {routing.PREFIX_AWARE} (longest cached prompt prefix, from the"
        f" engines' KV events, bounded by load) or {routing.LEAST_OUTSTANDING} (fewest requests in flight).",
    )
    decode_policy: RoutingPolicy = Field(
        default=routing.PREFIX_AWARE,
        description=f"How the router picks a decode: {routing.PREFIX_AWARE} (the decode already holding the longest"
        f" prefix, so fewer blocks are pulled) or {routing.LEAST_OUTSTANDING}.",
    )
    flow_control: FlowControlSpec = Field(default_factory=FlowControlSpec)
    disaggregation: DisaggregationSpec = Field(default_factory=DisaggregationSpec)
    prefix_scoring: PrefixScoringSpec = Field(default_factory=PrefixScoringSpec)


class PDBSpec(Model):
    max_unavailable: Union[Annotated[int, Field(ge=0)], Annotated[str, StringConstraints(pattern=r"^[0-9]+%$")]] = (
        Field(default=1, description="Pods of the role a voluntary disruption may take at once (a number or a percent).")
    )


class DisruptionSpec(Model):
    enabled: bool = Field(default=True, description="Render a PodDisruptionBudget per role.")
    prefill: PDBSpec = Field(default_factory=PDBSpec, description="The prefill pods' PodDisruptionBudget.")
    decode: PDBSpec = Field(default_factory=PDBSpec, description="The decode pods' PodDisruptionBudget.")


Ratio = Annotated[float, Field(ge=0.01, le=100)]


class RatioSpec(Model):
    """Bounds of prefill replicas / decode replicas; either may be left out."""

    min: Optional[Ratio] = Field(default=None, description="Fewest prefill replicas per decode replica.")
    max: Optional[Ratio] = Field(default=None, description="Most prefill replicas per decode replica.")


class PlannerSpec(Model):
    """pdfleet's SLO planner: reads the router's metrics and sets the scalers' replicas."""

    enabled: bool = Field(default=False, description="Run the planner for this fleet.")
    ttft_ms: Annotated[int, Field(ge=1, le=3_600_000)] = Field(default=800, description="p90 time to first token target.")
    itl_ms: Annotated[int, Field(ge=1, le=60_000)] = Field(default=60, description="p90 inter-token latency target.")
    interval_seconds: Annotated[int, Field(ge=1, le=3600)] = Field(default=30, description="How often it decides.")
    scale_down_delay_seconds: Annotated[int, Field(ge=0, le=86_400)] = Field(
        default=300, description="How long a lower size must be wanted before scaling down."
    )


class ScaleToZeroSpec(Model):
    """Scale to zero as a P/D pair (issue 41): both roles reach 0 together after idleSeconds with no request and
    leave 0 together on the first request, which the front ends hold meanwhile (their waiting room)."""

    enabled: bool = Field(default=False, description="Retire the pair when idle and wake it on the first request; "
                          "needs prefill.autoscaling and decode.autoscaling with minReplicas 0.")
    idle_seconds: Annotated[int, Field(ge=1, le=7 * 86_400)] = Field(
        default=300, description="How long the front ends must see no request (and none in flight) before both "
        "roles go to 0.")
    activation_timeout_seconds: Annotated[int, Field(ge=1, le=3600)] = Field(
        default=300, description="How long a front end holds a request for a pair to come up; then 503 with a "
        "reason header (no endpoint came up) or 429 with Retry-After (endpoints exist but are full).")
    max_waiting: Annotated[int, Field(ge=1, le=100_000)] = Field(
        default=1000, description="Most requests each front end holds while no pair is ready; more are refused.")


class ScalingSpec(Model):
    ratio: Optional[RatioSpec] = Field(
        default=None, description="Bounds of prefill/decode replicas that every scaling decision keeps."
    )
    planner: Optional[PlannerSpec] = Field(default=None, description="pdfleet's SLO planner.")
    scale_to_zero: Optional[ScaleToZeroSpec] = Field(
        default=None, description="Scale both roles to 0 together when idle, and back to 1 together on a request."
    )


class CanaryStep(Model):
    weight: Annotated[int, Field(ge=1, le=100)] = Field(
        description="Percent of new requests the router sends to the new prefill/decode pair during this step."
    )
    pause_seconds: Annotated[int, Field(ge=0, le=86_400)] = Field(
        default=60, description="How long the step must pass the analysis before the next step (or promotion)."
    )


class CanaryAnalysis(Model):
    """Limits on the new pair's figures over a step, from the router's per-revision signals; unset: not checked."""

    ttft_ms: Optional[Annotated[int, Field(ge=1, le=3_600_000)]] = Field(
        default=None, description="p90 time to first token the new pair must stay within."
    )
    itl_ms: Optional[Annotated[int, Field(ge=1, le=60_000)]] = Field(
        default=None, description="p90 inter-token latency the new pair must stay within."
    )
    max_error_rate: Optional[Annotated[float, Field(ge=0, le=1)]] = Field(
        default=None, description="Largest share (0..1) of the new pair's requests answered 5xx."
    )
    min_requests: Annotated[int, Field(ge=1, le=10_000_000)] = Field(
        default=100, description="Requests the new pair must have served in a step before it is judged."
    )
    max_recompute_rate: Optional[Annotated[float, Field(ge=0, le=1)]] = Field(
        default=None,
        description="Largest share (0..1) of the new pair's requests answered without their KV moving from its "
        "prefill: recomputed on decode after a refused or failed pull (its decodes' connector counters), or served "
        "by decode alone (where the router counts that per revision). Such requests answer 200 and pass maxErrorRate.",
    )


class CanarySpec(Model):
    steps: Annotated[list[CanaryStep], Field(min_length=1, max_length=20)] = Field(
        description="Weights in increasing order; after the last step passes, the new pair takes every request."
    )
    analysis: CanaryAnalysis = Field(default_factory=CanaryAnalysis)
    on_abort: Literal["Keep", "Delete"] = Field(
        default="Keep", description="After an abort: keep the new pair (weight 0) for inspection, or delete it."
    )


class RolloutSpec(Model):
    """How a new revision pair takes over from the serving one."""

    strategy: Literal["Paired", "Canary"] = Field(
        default="Paired",
        description="Paired: the new pair takes every request once it is ready. Canary: it takes a growing share, "
        "step by step, while the router's figures for it pass the analysis.",
    )
    canary: Optional[CanarySpec] = Field(default=None, description="Steps and analysis; required with Canary.")


def _cidr(value: str) -> str:
    if not cidr.is_cidr(value):
        raise PydanticCustomError("cidr", cidr.MESSAGE)
    return value


# Checked here (ipaddress) and by the CRD (cidr.cel_rule), in the same words.
Cidr = Annotated[
    str, StringConstraints(max_length=cidr.MAX_LENGTH), AfterValidator(_cidr),
    Field(json_schema_extra={"x-kubernetes-validations": [cidr.cel_rule()]}),
]


class IPBlock(Model):
    """A networking.k8s.io/v1 IPBlock, its CIDRs checked before apply."""

    cidr: Cidr = Field(description="The addresses admitted, e.g. 10.0.0.0/8.")
    except_: Optional[Annotated[list[Cidr], Field(max_length=32)]] = Field(
        default=None, alias="except", description="CIDRs inside cidr that are not admitted."
    )

    @model_validator(mode="after")
    def _except_within(self) -> "IPBlock":
        if any(not cidr.within(e, self.cidr) for e in self.except_ or ()):
            raise PydanticCustomError("cidr_except", cidr.EXCEPT_MESSAGE)
        return self


class NetworkPolicyPeer(Model):
    """A networking.k8s.io/v1 NetworkPolicyPeer: selectors pass through as written."""

    pod_selector: Optional[dict[str, Any]] = Field(default=None, description="A LabelSelector of pods.")
    namespace_selector: Optional[dict[str, Any]] = Field(default=None, description="A LabelSelector of namespaces.")
    ip_block: Optional[IPBlock] = Field(default=None, description="An IPBlock (cidr, except).")


class InferencePoolSpec(Model):
    """The fleet behind a cluster Gateway (Gateway API Inference Extension): an InferencePool
    (inference.networking.k8s.io/v1) over the decode pods, and the Endpoint Picker the gateway asks,
    over Envoy's ext_proc, which decode serves each request (the EPP runs the prefill leg)."""

    enabled: bool = Field(
        default=False,
        description="Render the InferencePool <name> and its Endpoint Picker (<name>-epp: Deployment, Service, "
        "ServiceAccount, Role, RoleBinding, PodDisruptionBudget). An HTTPRoute's backendRef names the pool.",
    )
    failure_mode: Literal[gateway.FAIL_OPEN, gateway.FAIL_CLOSE] = Field(
        default=gateway.FAIL_CLOSE,
        description=f"What the gateway does when the Endpoint Picker cannot be reached: {gateway.FAIL_CLOSE} "
        f"answers 5xx; {gateway.FAIL_OPEN} sends the request to a decode pod of the pool, which serves it "
        "alone (no prefill leg), but without the fleet's engine token (see failOpenWithoutEngineToken).",
    )
    fail_open_without_engine_token: bool = Field(
        default=False,
        description=f"Required (true) with failureMode {gateway.FAIL_OPEN}: the gateway's fallback request reaches "
        "decode without the fleet's engine API token (only the Endpoint Picker sets it), and the engines refuse "
        "such a request (401) unless the gateway itself sets the token. Set it to say you know, e.g. because your "
        f"gateway injects the token; otherwise use {gateway.FAIL_CLOSE} with eppReplicas >= 2.",
    )
    caller_auth: Literal[gateway.CALLER_AUTH_TOKEN, gateway.CALLER_AUTH_NONE] = Field(
        default=gateway.CALLER_AUTH_TOKEN,
        description=f"Who may call the Endpoint Picker. {gateway.CALLER_AUTH_TOKEN}: only a gateway that sends "
        f"the fleet's caller token (Secret <name>-epp-caller, key token) in the ext_proc stream's metadata "
        f"{gateway.CALLER_TOKEN_METADATA} (docs/gateway.md). {gateway.CALLER_AUTH_NONE}: any caller the "
        "NetworkPolicy admits, for a gateway that cannot send metadata (e.g. agentgateway); it needs "
        "network.networkPolicy and allowFrom, the only guard then.",
    )
    epp_replicas: Annotated[int, Field(ge=1, le=100)] = Field(
        default=2, description="Endpoint Picker replicas (each picks alone; two keep the path up through a drain)."
    )
    epp_port: Port = Field(
        default=gateway.EPP_GRPC, description="The Endpoint Picker's ext_proc gRPC port (Service and container)."
    )
    allow_from: Annotated[list[NetworkPolicyPeer], Field(max_length=32)] = Field(
        default_factory=list,
        description="The NetworkPolicy peers (networking.k8s.io/v1 from entries, e.g. the gateway's namespace) "
        "allowed to reach the decode pods' engine port; required with network.networkPolicy (namespaceSelector: {} "
        "admits every namespace).",
    )


class GatewaySpec(Model):
    inference_pool: InferencePoolSpec = Field(
        default_factory=InferencePoolSpec, description="An InferencePool and Endpoint Picker for a cluster Gateway."
    )


class DisaggregatedInferenceSpec(Model):
    model: ModelSpec = Field(description="The model both roles serve.")
    image: Optional[Annotated[str, StringConstraints(min_length=1, max_length=512)]] = Field(
        default=None, description="Runtime image; defaults to the operator's configured image."
    )
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Pull policy of every pod's image."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list, description="Secrets (in the fleet's namespace) for pulling the images."
    )
    engine: EngineSpec = Field(default_factory=EngineSpec, description="vLLM settings both roles share.")
    prefill: RoleSpec = Field(default_factory=RoleSpec, description="The prefill role: computes prompts' KV.")
    decode: RoleSpec = Field(default_factory=RoleSpec, description="The decode role: pulls the KV and generates.")
    kv_transfer: KVTransferSpec = Field(
        default_factory=KVTransferSpec, description="How the KV cache moves from prefill to decode (NIXL)."
    )
    kv_offload: Optional[KVOffloadSpec] = Field(
        default=None, description="A host-memory KV tier under the engines (vLLM's OffloadingConnector); unset: none."
    )
    network: NetworkSpec = Field(default_factory=NetworkSpec, description="RDMA, UCX, preflight, NetworkPolicy.")
    router: RouterSpec = Field(default_factory=RouterSpec, description="The P/D router in front of the fleet.")
    disruption: DisruptionSpec = Field(default_factory=DisruptionSpec, description="PodDisruptionBudgets per role.")
    scaling: ScalingSpec = Field(default_factory=ScalingSpec, description="Ratio bounds and the SLO planner.")
    rollout: RolloutSpec = Field(default_factory=RolloutSpec, description="How a new revision takes over.")
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec, description="Gang scheduling and queues.")
    placement: PlacementSpec = Field(
        default_factory=PlacementSpec, description="Where decode pods go relative to prefill pods."
    )
    gateway: GatewaySpec = Field(default_factory=GatewaySpec, description="The fleet behind a cluster Gateway.")
    progress_deadline_seconds: Annotated[int, Field(ge=1, le=MAX_PROGRESS_DEADLINE_SECONDS)] = Field(
        default=DEFAULT_PROGRESS_DEADLINE_SECONDS,
        description="Seconds after the current generation started progressing (status.progressingSince) after "
        "which a fleet that is still not complete is Stalled=True (reason ProgressDeadlineExceeded), so that "
        "Argo CD and Flux stop waiting; sized for a model download. Cleared when the fleet is Ready.",
    )

    def role(self, role: str) -> RoleSpec:
        return {"prefill": self.prefill, "decode": self.decode}[role]


# --- status (written by the operator) ---------------------------------------


class Condition(Model):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    last_transition_time: Optional[str] = None
    observed_generation: Optional[int] = None


class KVTransportStatus(Model):
    """The fabric preflight's verdict for one role (the KVTransport condition, per role)."""

    status: Literal["True", "False", "Unknown"]
    reason: str = ""
    message: str = ""
    transport: Optional[str] = None
    g_bps: Optional[float] = Field(default=None, alias="gBps")


class RoleStatus(Model):
    replicas: int = 0
    desired_replicas: int = Field(default=0, description="Replicas the role's workloads ask for (an autoscaler's "
                                  "choice under autoscaling), of the serving revision.")
    ready_replicas: int = 0
    updated_replicas: int = 0
    kv_transport: Optional[KVTransportStatus] = None


class PrefillEndpoint(Model):
    pod: str
    ip: str
    side_channel_port: int
    http_port: int
    revision: str
    kv_events_port: Optional[int] = Field(default=None, description="The engine's KV event (ZMQ PUB) port.")


class EndpointsStatus(Model):
    prefill: list[PrefillEndpoint] = Field(default_factory=list)


class RolloutStatus(Model):
    """Rollout state, persisted so that an operator restart mid-rollout converges."""

    target_revision: str
    previous_revision: Optional[str] = None
    switched_at: Optional[str] = None
    strategy: Optional[Literal["Paired", "Canary"]] = None
    canary_revision: Optional[str] = Field(default=None, description="The revision pair the canary below is about.")
    phase: Optional[Literal["Progressing", "Promoted", "Aborted"]] = None
    step: Optional[int] = Field(default=None, description="The canary's current step, from 1.")
    step_started_at: Optional[str] = None
    weight: Optional[int] = Field(default=None, description="Percent of new requests the router sends to the canary.")
    last_analysis: Optional[str] = None
    stale_override: Optional[str] = Field(
        default=None, description="The pdfleet.io/rollout annotation's value when the canary started: ignored "
        "until it is removed or changed (it was left from an earlier rollout).")


class RoleScalingStatus(Model):
    requested_replicas: int = 0
    replicas: int = 0
    reason: str = ""


class ScalingStatus(Model):
    """Per autoscaled role: what its scaler asked, what was applied and why; the planner's last decision."""

    prefill: Optional[RoleScalingStatus] = None
    decode: Optional[RoleScalingStatus] = None
    planner: Optional[str] = None


class KVOffloadStatus(Model):
    """The host-memory KV tier of spec.kvOffload, as the engines were configured with it."""

    capacity: str = Field(description="Per engine, as the spec gives it.")
    capacity_bytes: int = Field(description="Per engine, in bytes (the engines' cpu_bytes_to_use).")
    roles: list[str] = Field(default_factory=list, description="The roles whose engines hold the tier.")
    block_size: int = Field(description="Tokens per offloaded chunk.")


class DisaggregatedInferenceStatus(Model):
    observed_generation: Optional[int] = None
    conditions: list[Condition] = Field(default_factory=list)
    revision: Optional[str] = None
    prefill: Optional[RoleStatus] = None
    decode: Optional[RoleStatus] = None
    router: Optional[RoleStatus] = None
    epp: Optional[RoleStatus] = Field(default=None, description="The Endpoint Picker (spec.gateway.inferencePool).")
    endpoints: Optional[EndpointsStatus] = None
    url: Optional[str] = None
    rollout: Optional[RolloutStatus] = None
    scaling: Optional[ScalingStatus] = None
    kv_offload: Optional[KVOffloadStatus] = Field(default=None, description="The host-memory KV tier (spec.kvOffload).")
    progressing_since: Optional[str] = Field(
        default=None, description="When the fleet started progressing towards the current generation "
        "(spec.progressDeadlineSeconds counts from here); unset while it is complete.")


# The CRD's rule on metadata.name says this too (crd.py), so that validate and the API server agree word for word.
NAME_MESSAGE = (
    f"must be a DNS-1035 label of at most {MAX_NAME_LENGTH} characters (lower-case letters, digits and '-', "
    "starting with a letter)"
)


def _fleet_name(value: str) -> str:
    if len(value) > MAX_NAME_LENGTH or not re.fullmatch(DNS1035_LABEL, value):
        raise PydanticCustomError("fleet_name", NAME_MESSAGE)
    return value


class ObjectMeta(Model):
    """The part of metadata pdfleet reads; everything else passes through."""

    model_config = ConfigDict(extra="allow", alias_generator=to_camel, populate_by_name=True)

    name: Annotated[str, AfterValidator(_fleet_name)]
    namespace: Optional[str] = None
    uid: Optional[str] = None
    generation: Optional[int] = None


class DisaggregatedInference(Model):
    api_version: Literal["pdfleet.io/v1alpha1"] = API_VERSION
    kind: Literal["DisaggregatedInference"] = KIND
    metadata: ObjectMeta
    spec: DisaggregatedInferenceSpec
    status: Optional[DisaggregatedInferenceStatus] = None
