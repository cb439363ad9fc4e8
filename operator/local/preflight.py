"""The fabric preflight of a local fleet: the pods' check, run once per distinct UCX setting.

The same probe as the pods' `kv-preflight` init container (pdfleet.connector.fabric): a
loopback NIXL READ with the engine's UCX environment, decided by the same pure verdict.
Local engines run on one host, so what it measures is the host path (cma here).
"""

from __future__ import annotations

from typing import Mapping

from pdfleet.connector.fabric.probe import run_probe
from pdfleet.connector.fabric.verdict import Verdict
from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan.engine import engine_env
from pdfleet.operator.plan.fabric import PROBE_MIB, wants_rdma

ROLES = ("prefill", "decode")


def role_env(spec: DisaggregatedInferenceSpec, role: str, base_env: Mapping[str, str]) -> dict[str, str]:
    """The environment an engine of this role gets, as far as UCX is concerned."""
    env = {k: v for k, v in base_env.items() if not k.startswith("UCX_")}
    env.update({k: v for k, v in engine_env(spec, role).items() if k.startswith("UCX_")})
    return env


def local_kv_transport(spec: DisaggregatedInferenceSpec, base_env: Mapping[str, str]) -> dict[str, Verdict]:
    """role -> verdict; roles with the same UCX settings share one probe."""
    by_setting: dict[tuple[tuple[str, str], ...], Verdict] = {}
    out: dict[str, Verdict] = {}
    for role in ROLES:
        env = role_env(spec, role, base_env)
        key = tuple(sorted((k, v) for k, v in env.items() if k.startswith("UCX_")))
        if key not in by_setting:
            by_setting[key], _ = run_probe(want="rdma" if wants_rdma(spec) else "any",
                                           min_gbps=spec.network.preflight.min_g_bps, mib=PROBE_MIB, env=env)
        out[role] = by_setting[key]
    return out


def condition(verdicts: Mapping[str, Verdict]) -> dict[str, object]:
    """The fleet's KVTransport condition: the first failing role, else True with every role's figures."""
    for role, v in verdicts.items():
        if not v.status:
            return {**v.as_dict(), "message": f"{role}: {v.message}"}
    first = next(iter(verdicts.values()))
    return {**first.as_dict(), "message": "; ".join(f"{r}: {v.message}" for r, v in verdicts.items()),
            "gBps": min((v.gbps for v in verdicts.values() if v.gbps is not None), default=None)}
