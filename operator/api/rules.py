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

from dataclasses import dataclass
from typing import Callable, Optional

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
)
RESERVED_LABEL_PREFIXES = ("pdfleet.io/", "app.kubernetes.io/")


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


def gpus(role: RoleSpec) -> int:
    """GPUs a pod of this role gets: one per TP rank unless set."""
    return role.tensor_parallel_size if role.resources.gpus is None else role.resources.gpus


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
        return spec.kv_transfer.buffer_device != "cuda" or gpus(role) >= role.tensor_parallel_size

    return check


def _ports_distinct(spec: DisaggregatedInferenceSpec) -> bool:
    first = spec.kv_transfer.side_channel_port
    return not (first <= spec.engine.port < first + max_tp(spec))


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
        f" || self.{role}.resources.gpus >= self.{role}.tensorParallelSize"
    )


def _cpu_cel(role: str) -> str:
    return f"(has(self.{role}.resources.gpus) && self.{role}.resources.gpus == 0)"


SPEC_RULES: tuple[Rule, ...] = (
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
            message=f"kvTransfer.bufferDevice 'cuda' needs at least {role}.tensorParallelSize GPUs per pod",
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


def _owned_flag(arg: str) -> Optional[str]:
    flag = arg.split("=", 1)[0]
    return flag if flag in OWNED_FLAGS else None


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
                    FieldError(f"spec.{path}[{i}]", f"{flag} is set by pdfleet from the spec; remove it from extraArgs")
                )
    for role in ROLES:
        for key in spec.role(role).pod_labels:
            if key.startswith(RESERVED_LABEL_PREFIXES):
                errors.append(
                    FieldError(
                        f"spec.{role}.podLabels.{key}",
                        f"labels under {' and '.join(RESERVED_LABEL_PREFIXES)} are set by pdfleet",
                    )
                )
    return errors


def spec_errors(spec: DisaggregatedInferenceSpec) -> list[FieldError]:
    """Every cross-field problem of a spec that parsed, in a stable order."""
    errors = [FieldError(rule.spec_field, rule.message) for rule in SPEC_RULES if not rule.check(spec)]
    return errors + operator_only_errors(spec)
