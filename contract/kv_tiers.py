"""KV cache tiers as the router weighs them (spec.router.prefixScoring.tierWeights), spelled once.

vLLM's KV events name the medium that holds a block: ``GPU`` (the engine's own KV cache; an event
without a medium is one of these), ``CPU`` and ``STORAGE`` (the OffloadingConnector's tiers). The
router scores a cached block by the best tier that holds it, weighted: a block the engine must first
load from host memory saves less than one already on the device. The operator renders the weights
as one router flag, ``--prefix-tier-weights GPU=1.0,CPU=0.75,STORAGE=0.25`` (``render``), and the
router and the Endpoint Picker parse it back (``parse``).
"""

from __future__ import annotations

from collections.abc import Mapping

MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE = "GPU", "CPU", "STORAGE"  # vllm/distributed/kv_events.py
MEDIUMS = (MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE)
# The medium label of pdfleet_router_prefix_cached_tokens_total: one of MEDIUMS, or this for tokens the
# router estimated from what it routed itself (no KV events: it cannot tell the tier).
MEDIUM_LABEL = "medium"
MEDIUM_UNKNOWN = "unknown"
# GPU 1.0 and CPU 0.75 as the issue asks (llm-d weighs CPU 0.8); STORAGE 0.25 as Dynamo weighs disk.
DEFAULT_TIER_WEIGHTS: tuple[tuple[str, float], ...] = ((MEDIUM_GPU, 1.0), (MEDIUM_CPU, 0.75), (MEDIUM_STORAGE, 0.25))
FLAG = "--prefix-tier-weights"


def check(weights: Mapping[str, float]) -> list[str]:
    """What is wrong with ``weights`` (every medium once, each in [0, 1], one of them above 0); [] when nothing.
    A weight of 0 leaves that tier out of the index altogether (the router before tiers: GPU only)."""
    problems = []
    if set(weights) != set(MEDIUMS):
        problems.append(f"tierWeights: give exactly {', '.join(MEDIUMS)}, got {', '.join(sorted(weights)) or 'none'}")
    for medium, w in weights.items():
        if not isinstance(w, (int, float)) or isinstance(w, bool) or not 0.0 <= w <= 1.0:
            problems.append(f"tierWeights.{medium}: must be a number in [0, 1], got {w!r}")
    if not problems and not any(w > 0 for w in weights.values()):
        problems.append("tierWeights: at least one tier's weight must be above 0")
    return problems


def render(weights: tuple[tuple[str, float], ...]) -> str:
    return ",".join(f"{m}={w:g}" for m, w in weights)


def parse(value: str) -> tuple[tuple[str, float], ...]:
    """``GPU=1,CPU=0.75,STORAGE=0.25`` in MEDIUMS' order; ValueError naming the flag when it is wrong."""
    weights: dict[str, float] = {}
    for item in value.split(","):
        medium, sep, number = item.strip().partition("=")
        try:
            if not sep or medium in weights:
                raise ValueError
            weights[medium] = float(number)
        except ValueError:
            raise ValueError(f"{FLAG} {value!r}: expected {render(DEFAULT_TIER_WEIGHTS)}") from None
    problems = check(weights)
    if problems:
        raise ValueError(f"{FLAG} {value!r}: " + "; ".join(problems))
    return tuple((m, weights[m]) for m in MEDIUMS)


__all__ = ["MEDIUMS", "MEDIUM_GPU", "MEDIUM_CPU", "MEDIUM_STORAGE", "MEDIUM_LABEL", "MEDIUM_UNKNOWN",
           "DEFAULT_TIER_WEIGHTS", "FLAG", "check", "render", "parse"]
