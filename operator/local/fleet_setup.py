"""What a `pdfleet local` run prepares before an engine starts: the run's signing key, bind-checked
ports for every engine, and the plan (fleet.py) over them; and new ports for an engine whose start
failed on a port taken in between."""

from __future__ import annotations

import dataclasses
import os
import secrets
from pathlib import Path
from typing import Mapping, Optional

from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.local.fleet import (
    ROLES,
    EngineLaunch,
    EnginePorts,
    LocalPlan,
    fleet_ports,
    kv_events_endpoints,
    plan_local,
    with_ports,
)
from pdfleet.operator.local.processes import reserve_ports
from pdfleet.operator.plan.engine import SECRET_FILE
from pdfleet.operator.plan.naming import revision


def write_run_secret(run_dir: Path) -> str:
    """A side-channel key made for this run only, as the pods sign with their fleet's Secret (created
    0600 before any byte is written; never printed). Returns its path."""
    path = run_dir / SECRET_FILE
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(secrets.token_hex(32))
    return str(path)


def reserve_engine_ports(spec: DisaggregatedInferenceSpec, run_dir: Path) -> dict[str, list[EnginePorts]]:
    """Per role, each replica's HTTP port, side-channel range (one port per TP rank) and KV event
    endpoints (local sockets in ``run_dir``); no two engines share a port."""
    ports: dict[str, list[EnginePorts]] = {}
    taken: list[int] = []  # ports outside the ephemeral range, bind-checked (ports.py)
    for role in ROLES:
        r = spec.role(role)
        http = reserve_ports(r.replicas, taken=taken)
        taken += http
        side = reserve_ports(r.replicas, consecutive=r.tensor_parallel_size, taken=taken)
        taken += [b + k for b in side for k in range(r.tensor_parallel_size)]
        ports[role] = [EnginePorts(h, s, *kv_events_endpoints(str(run_dir.resolve()), f"{role}-{i}"))
                       for i, (h, s) in enumerate(zip(http, side))]
    return ports


def plan_fleet(spec: DisaggregatedInferenceSpec, run_dir: Path, model_path: Optional[str]) -> LocalPlan:
    """The run's engines: signed with a key of this run's, on free ports, the CPUs split between them."""
    secret_file = write_run_secret(run_dir)
    return plan_local(
        spec,
        revision=revision(spec, "local"),
        model_path=model_path,
        cpus=sorted(os.sched_getaffinity(0)),
        ports=reserve_engine_ports(spec, run_dir),
        base_env=os.environ,
        secret_file=secret_file,
    )


def on_new_ports(launches: Mapping[str, EngineLaunch], name: str) -> EngineLaunch:
    """Engine ``name`` on a new HTTP port and side-channel range, none of them a port any launch was
    given (its own old ones included: the program that took one may hold the others)."""
    launch = launches[name]
    tp = len(launch.cpus)
    taken = sorted(fleet_ports(launches.values()))
    (http,) = reserve_ports(1, taken=taken)
    (side,) = reserve_ports(1, consecutive=tp, taken=[*taken, http])
    return with_ports(launch, dataclasses.replace(launch.ports, http=http, side_channel=side))
