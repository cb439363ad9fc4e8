"""The local fleet a DisaggregatedInference describes, as process launches (pure).

The engine command comes from the plan (`pdfleet.operator.plan.engine.vllm_args`),
the very command the pods run; only the host, the ports, the model path and the
CPU pinning are local. Nothing here starts a process or opens a port. The router
`pdfleet local` runs in its own process is configured from the same launches
(``router_config``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from typing import Iterable, Mapping, Optional, Sequence

from pdfleet.contract import env as env_names
from pdfleet.contract.router_config import RouterConfig
from pdfleet.operator.api.rules import FieldError
from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan.engine import ENGINE_MODULE, UCX_CUDA_IPC_GET_ZCOPY, engine_env, hash_seed, vllm_args
from pdfleet.operator.plan.router import (
    disaggregation_fields,
    flow_control_config,
    prefix_scoring_fields,
    scale_to_zero_fields,
)

ROLES = ("prefill", "decode")
LOOPBACK = "127.0.0.1"
# Bound on vLLM's lost engine-core/worker wake-ups in local engines (connector/adapter/vllm_workarounds.py):
# about 20 re-checks a second per parked reader, no measurable cost.
LOCAL_SHM_RECHECK_MS = 50
# How long vLLM's readers of an engine may spin after a read when it shares a CPU with another engine or
# has a rank on a single CPU, beside the unpinned router and API servers (spin_capped_engines).
LOCAL_SHARED_CPU_SPIN_MS = 5
# ... and how long they sleep between polls inside that window instead of sched_yield (a yielding reader
# still takes its fair share of the CPU; 2 + 1 fleets on 2 CPUs: 121-142 ms of CPU per request, not 180-214).
LOCAL_SHARED_CPU_SPIN_NAP_US = 1000
# KV cache per engine (GiB) unless the spec's env sets one: a local fleet shares one machine.
DEFAULT_KVCACHE_GIB = "1"


@dataclass(frozen=True)
class EnginePorts:
    http: int
    side_channel: int  # TP rank r listens on side_channel + r
    kv_events: Optional[str] = None  # the engine's KV event PUB endpoint (a local socket)
    kv_events_replay: Optional[str] = None


@dataclass(frozen=True)
class EngineLaunch:
    name: str  # e.g. "prefill-0"
    role: str
    index: int
    argv: tuple[str, ...]
    env: Mapping[str, str]  # added to the runner's environment
    ports: EnginePorts
    cpus: tuple[tuple[int, ...], ...]  # one CPU list per TP rank

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.ports.http}"


@dataclass(frozen=True)
class LocalPlan:
    engines: tuple[EngineLaunch, ...]
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def role(self, role: str) -> tuple[EngineLaunch, ...]:
        return tuple(e for e in self.engines if e.role == role)


def starts_at_zero(spec: DisaggregatedInferenceSpec) -> bool:
    """Both roles at 0 replicas with scale to zero on: the run starts with the pair asleep (as the scalers
    would), its front ends holding the first request that wakes it."""
    s = spec.scaling.scale_to_zero
    return s is not None and s.enabled and all(spec.role(role).replicas == 0 for role in ROLES)


def awake_spec(spec: DisaggregatedInferenceSpec) -> DisaggregatedInferenceSpec:
    """The spec whose engines a wake starts: a pair that starts asleep wakes to 1 of each role (the scalers'
    0 -> 1); any other spec as it is."""
    if not starts_at_zero(spec):
        return spec
    return spec.model_copy(update={role: spec.role(role).model_copy(update={"replicas": 1}) for role in ROLES})


def local_errors(spec: DisaggregatedInferenceSpec, *, has_gpu: bool) -> list[FieldError]:
    """What a valid resource still needs to run as processes on this machine."""
    errors = []
    asleep = starts_at_zero(spec)
    for role in ROLES:
        if spec.role(role).replicas < 1 and not asleep:
            errors.append(FieldError(f"spec.{role}.replicas", "a local fleet needs at least 1 (0 only for both "
                                     "roles with spec.scaling.scaleToZero.enabled: the pair then starts asleep)"))
    if not has_gpu:
        if spec.kv_transfer.buffer_device != "cpu":
            errors.append(FieldError(
                "spec.kvTransfer.bufferDevice",
                f"{spec.kv_transfer.buffer_device!r} needs a GPU and this machine has none; set it to 'cpu'",
            ))
        if spec.engine.block_size % 32:
            errors.append(FieldError(
                "spec.engine.blockSize",
                f"CPU engines need a multiple of 32, got {spec.engine.block_size}",
            ))
    return errors


# What sharing costs, measured (bench/local_throughput.py, 2 cores, docs/reliability.md): on the issue-17
# workload a 2 prefill + 1 decode fleet served about 600-1,050 requests/min where 1 + 1 served about
# 1,200-1,400 and one plain vLLM server about 1,250-2,800.
SHARING_COST = ("engines on the same CPU slow each other down (vLLM's CPU engines poll while they wait for"
                " work; measured here: 2 prefill + 1 decode on 2 CPUs ~600-1,050 requests/min, 1 + 1 ~1,200-1,400)")


def _split(cpus: Sequence[int], n: int) -> list[list[int]]:
    """n contiguous, even shares of cpus (len(cpus) >= n)."""
    base, extra = divmod(len(cpus), n)
    chunks, start = [], 0
    for k in range(n):
        size = base + (1 if k < extra else 0)
        chunks.append(list(cpus[start:start + size]))
        start += size
    return chunks


def shared_cpu_engines(pinning: Sequence[Sequence[Sequence[int]]]) -> set[int]:
    """Indices of the engines (in ``assign_cpus`` order) that have a CPU some other engine has too."""
    owners: dict[int, set[int]] = {}
    for n, ranks in enumerate(pinning):
        for cpu in {c for rank in ranks for c in rank}:
            owners.setdefault(cpu, set()).add(n)
    return {n for engines in owners.values() if len(engines) > 1 for n in engines}


def spin_capped_engines(pinning: Sequence[Sequence[Sequence[int]]]) -> set[int]:
    """Indices of the engines whose vLLM readers must not spin for a second after each read.

    Those that share a CPU with another engine, and those with a rank pinned to a single CPU:
    the router, the engines' API servers and engine cores run unpinned, so they share that CPU
    with the spinning reader, and every request waits on them (a 1 + 1 fleet on 2 CPUs: 275-795
    requests/min spinning, 853-1,271 capped; docs/reliability.md). A rank with CPUs to spare
    spins as vLLM does."""
    single = {n for n, ranks in enumerate(pinning) if any(len(set(rank)) < 2 for rank in ranks)}
    return single | shared_cpu_engines(pinning)


def assign_cpus(cpus: Sequence[int], ranks: Sequence[int],
                roles: Optional[Sequence[str]] = None) -> tuple[list[list[list[int]]], list[str]]:
    """Split the machine's CPUs between engines: `ranks[i]` is engine i's TP size, `roles[i]` its role.

    Returns, per engine, one CPU list per rank, and warnings. With at least one CPU
    per rank every rank gets its own contiguous share (vLLM's OpenMP threads spin,
    so engines on the same cores slow each other down by orders of magnitude).
    With fewer, the roles still never share a CPU: each role gets its own CPUs (decode
    the larger half: it is latency-bound and holds every request's lease while it waits)
    and the ranks of one role share those round robin, so a busy prefill cannot starve
    decode, nor decode the prefill side channel decode waits on. A warning names what shares.
    """
    cpus = sorted(cpus)
    total = sum(ranks)
    if not cpus:
        raise ValueError("no CPUs to pin engines to")
    roles = list(roles) if roles is not None else ["engine"] * len(ranks)
    if len(roles) != len(ranks):
        raise ValueError("roles and ranks must have the same length")
    if total <= len(cpus):
        chunks = _split(cpus, total)
        warnings: list[str] = []
    else:
        order = list(dict.fromkeys(roles))  # roles in order of appearance
        role_ranks = {r: sum(n for n, rr in zip(ranks, roles) if rr == r) for r in order}
        if len(order) > len(cpus):
            shares = {r: cpus for r in order}  # fewer CPUs than roles: every role shares everything
        else:
            # Each role gets CPUs in proportion to its ranks, at least one; an odd CPU goes to decode.
            counts = {r: max(1, len(cpus) * role_ranks[r] // total) for r in order}
            while sum(counts.values()) > len(cpus):
                counts[max(counts, key=lambda r: (counts[r], r == "prefill"))] -= 1
            while sum(counts.values()) < len(cpus):
                counts["decode" if "decode" in counts else order[-1]] += 1
            shares, start = {}, 0
            for r in order:
                shares[r] = cpus[start:start + counts[r]]
                start += counts[r]
        next_cpu = {r: 0 for r in order}
        chunks = []
        for n, r in zip(ranks, roles):
            for _ in range(n):
                chunks.append([shares[r][next_cpu[r] % len(shares[r])]])
                next_cpu[r] += 1
        shared = ", ".join(f"{role_ranks[r]} {r} rank(s) on CPU(s) {','.join(map(str, shares[r]))}"
                           for r in order if role_ranks[r] > len(shares[r]) or len(order) > len(cpus))
        warnings = [
            f"{total} engine ranks share {len(cpus)} CPUs ({shared}): {SHARING_COST};"
            " lower prefill/decode replicas or tensorParallelSize for a local fleet"
        ]
    out, k = [], 0
    for n in ranks:
        out.append(chunks[k:k + n])
        k += n
    return out, warnings


def kv_events_endpoints(run_dir: str, name: str) -> tuple[str, str]:
    """A local engine's KV event sockets: ipc files in the run directory, not ports on every
    interface (vLLM binds a PUB endpoint only as tcp://*:PORT, and events carry prompt tokens)."""
    return f"ipc://{run_dir}/{name}.kv-events", f"ipc://{run_dir}/{name}.kv-events-replay"


def omp_bind(cpus: Sequence[Sequence[int]]) -> str:
    """VLLM_CPU_OMP_THREADS_BIND: one comma list per TP rank, joined by '|'."""
    return "|".join(",".join(str(c) for c in rank) for rank in cpus)


def _user_sets(spec: DisaggregatedInferenceSpec, role: str, name: str) -> bool:
    return any(var.name == name for var in [*spec.engine.env, *spec.role(role).env])


def plan_local(
    spec: DisaggregatedInferenceSpec,
    *,
    revision: str,
    model_path: Optional[str],
    cpus: Sequence[int],
    ports: Mapping[str, Sequence[EnginePorts]],
    base_env: Mapping[str, str],
    secret_file: Optional[str] = None,
    python: str = sys.executable,
) -> LocalPlan:
    """Every engine of the fleet: prefill replicas first, then decode.

    `ports[role][i]` are replica i's ports; `base_env` is the runner's environment
    (only read, to leave a user's VLLM_CPU_KVCACHE_SPACE alone).
    """
    order = [(role, i) for role in ROLES for i in range(spec.role(role).replicas)]
    pinning, warnings = assign_cpus(cpus, [spec.role(role).tensor_parallel_size for role, _ in order],
                                    [role for role, _ in order])
    capped = spin_capped_engines(pinning)
    engines = []
    for n, ((role, i), rank_cpus) in enumerate(zip(order, pinning)):
        p = ports[role][i]
        events = (p.kv_events, p.kv_events_replay) if p.kv_events else None
        args = vllm_args(spec, role, revision, model=model_path, host=LOOPBACK, port=p.http, secret_file=secret_file,
                         kv_events=events)
        env = dict(engine_env(spec, role))
        if "VLLM_CPU_KVCACHE_SPACE" not in env and "VLLM_CPU_KVCACHE_SPACE" not in base_env:
            env["VLLM_CPU_KVCACHE_SPACE"] = DEFAULT_KVCACHE_GIB
        if UCX_CUDA_IPC_GET_ZCOPY in base_env and not _user_sets(spec, role, UCX_CUDA_IPC_GET_ZCOPY):
            env.pop(UCX_CUDA_IPC_GET_ZCOPY, None)  # the runner's own setting wins over pdfleet's default
        env.update({
            # Local overrides of what the pod gets from the downward API and the spec.
            env_names.SIDE_CHANNEL_HOST: LOOPBACK,
            env_names.SIDE_CHANNEL_PORT: str(p.side_channel),
            "VLLM_CPU_OMP_THREADS_BIND": omp_bind(rank_cpus),
            "PYTHONUNBUFFERED": "1",
        })
        # Engines on one machine starve vLLM's wake-up notifications (vllm_workarounds.py).
        env.setdefault(env_names.VLLM_SHM_RECHECK_MS, str(LOCAL_SHM_RECHECK_MS))
        if n in capped:  # its readers' spinning would take the CPU from the processes beside it
            env.setdefault(env_names.VLLM_SHM_SPIN_MS, str(LOCAL_SHARED_CPU_SPIN_MS))
            env.setdefault(env_names.VLLM_SHM_SPIN_NAP_US, str(LOCAL_SHARED_CPU_SPIN_NAP_US))
        engines.append(EngineLaunch(
            name=f"{role}-{i}",
            role=role,
            index=i,
            argv=(python, "-m", ENGINE_MODULE, *args),
            env=env,
            ports=p,
            cpus=tuple(tuple(r) for r in rank_cpus),
        ))
    return LocalPlan(engines=tuple(engines), warnings=tuple(warnings))


def with_ports(launch: EngineLaunch, ports: EnginePorts) -> EngineLaunch:
    """The same engine on other ports: its ``--port`` argument and side-channel port variable rewritten
    (an engine whose start failed on a port taken by another process starts again on new ones)."""
    at = [i for i, arg in enumerate(launch.argv) if arg == "--port"]
    if len(at) != 1 or at[0] + 1 >= len(launch.argv):
        raise ValueError(f"{launch.name}: its command must carry one --port PORT, found {len(at)}")
    argv = list(launch.argv)
    argv[at[0] + 1] = str(ports.http)
    env = {**launch.env, env_names.SIDE_CHANNEL_PORT: str(ports.side_channel)}
    return replace(launch, argv=tuple(argv), env=env, ports=ports)


def fleet_ports(launches: Iterable[EngineLaunch]) -> set[int]:
    """Every port the launches were given: each one's HTTP port and its TP ranks' side-channel ports
    (an engine started again on new ports must take none of them, its own old ones included)."""
    return {p for launch in launches
            for p in (launch.ports.http, *range(launch.ports.side_channel, launch.ports.side_channel + len(launch.cpus)))}


def router_config(spec: DisaggregatedInferenceSpec, launches: Iterable[EngineLaunch],
                  model_path: Optional[str]) -> RouterConfig:
    """The P/D router over the local engines: their URLs as static endpoints, each engine's KV event
    endpoints, and the spec's routing settings; the tokenizer is the generated model's, if any."""
    launches = tuple(launches)
    return RouterConfig(
        prefill=tuple(lch.url for lch in launches if lch.role == "prefill"),
        decode=tuple(lch.url for lch in launches if lch.role == "decode"),
        prefill_policy=spec.router.prefill_policy, decode_policy=spec.router.decode_policy,
        kv_events=tuple((lch.url, f"{lch.ports.kv_events},{lch.ports.kv_events_replay}")
                        for lch in launches if lch.ports.kv_events),
        tokenizer=model_path or spec.model.name, block_size=spec.engine.block_size,
        hash_seed=hash_seed(spec), flow_control=flow_control_config(spec), **disaggregation_fields(spec),
        **prefix_scoring_fields(spec), **scale_to_zero_fields(spec),
    )
