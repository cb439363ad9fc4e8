"""Remote prefill or decode alone, per request (pure; table-tested in tests/unit/router).

A remote prefill pays a second scheduling step, an HTTP leg and a KV pull before decode's first
token. It earns that only when decode would otherwise compute many prompt tokens itself. Under
``Conditional`` decode serves alone when

- the prompt is shorter than one KV block (nothing whole to transfer: decode computes it anyway),
- decode already holds all but fewer than ``min_remote_prefill_tokens`` of it (a later turn),
- or every prefill is busy (``prefill_busy_in_flight`` legs or more) while the decode has fewer
  requests in flight than the least loaded prefill: computing locally beats queueing.

Requests that vLLM splits into several engine requests (fanout.py) always go to decode alone.
The canary pair is chosen before this decision, so both paths stay inside one revision pair.
"""

from __future__ import annotations

from dataclasses import dataclass

from pdfleet.connector.serving import fanout
from pdfleet.contract.routing import (
    DECODE_ONLY,
    DISAGGREGATION_ALWAYS,
    DISAGGREGATION_CONDITIONAL,
    DISAGGREGATION_POLICIES,
    REMOTE_PREFILL,
)

# reasons (the decisions metric's label `reason`)
ALWAYS = "always"
FAN_OUT = fanout.FAN_OUT  # n > 1 or several prompts (fanout.py)
SHORT_PROMPT = "short_prompt"
CACHED_ON_DECODE = "cached_on_decode"
PREFILL_BUSY = "prefill_busy"
LONG_UNCACHED = "long_uncached"
REASONS = (ALWAYS, FAN_OUT, SHORT_PROMPT, CACHED_ON_DECODE, PREFILL_BUSY, LONG_UNCACHED)


@dataclass(frozen=True)
class Policy:
    policy: str = DISAGGREGATION_ALWAYS
    min_remote_prefill_tokens: int = 128
    prefill_busy_in_flight: int = 4
    block_size: int = 16

    def __post_init__(self) -> None:
        if self.policy not in DISAGGREGATION_POLICIES:
            raise ValueError(f"disaggregation policy: must be one of {', '.join(DISAGGREGATION_POLICIES)}, "
                             f"got {self.policy!r}")
        if self.block_size < 1 or self.min_remote_prefill_tokens < 0 or self.prefill_busy_in_flight < 1:
            raise ValueError("disaggregation: block_size and prefill_busy_in_flight must be >= 1, "
                             "min_remote_prefill_tokens >= 0")

    def tokens_wanted(self, cached_on_decode: int) -> int:
        """How many prompt tokens the caller needs to count at most to decide (a cap on tokenizing)."""
        return cached_on_decode + max(self.min_remote_prefill_tokens, self.block_size)


@dataclass(frozen=True)
class Request:
    """What the router knows of one request when it decides."""

    prompt_tokens: int  # whole-block prompt tokens known (may be capped at Policy.tokens_wanted), or an estimate
    cached_on_decode: int  # leading prompt tokens the chosen decode holds in its prefix cache
    prefill_in_flight: tuple[int, ...]  # legs in flight on each ready prefill
    decode_in_flight: int  # requests in flight on the chosen decode
    fan_out: bool = False  # several engine requests (fanout.py)


@dataclass(frozen=True)
class Decision:
    decision: str  # REMOTE_PREFILL | DECODE_ONLY
    reason: str

    @property
    def remote(self) -> bool:
        return self.decision == REMOTE_PREFILL

    def header(self) -> str:
        return f"{self.decision}; reason={self.reason}"


def decide(policy: Policy, req: Request) -> Decision:
    if req.fan_out:
        return Decision(DECODE_ONLY, FAN_OUT)
    if policy.policy != DISAGGREGATION_CONDITIONAL:
        return Decision(REMOTE_PREFILL, ALWAYS)
    floor = max(policy.min_remote_prefill_tokens, policy.block_size)
    if req.prompt_tokens < floor:
        return Decision(DECODE_ONLY, SHORT_PROMPT)
    if req.prompt_tokens - req.cached_on_decode < floor:
        return Decision(DECODE_ONLY, CACHED_ON_DECODE)
    # No prefill ready: the prefill leg finds none and decode serves alone as a fallback (handlers.py).
    least = min(req.prefill_in_flight, default=0)
    if least >= policy.prefill_busy_in_flight and req.decode_in_flight < least:
        return Decision(DECODE_ONLY, PREFILL_BUSY)
    return Decision(REMOTE_PREFILL, LONG_UNCACHED)


__all__ = ["Policy", "Request", "Decision", "decide", "REASONS", "REMOTE_PREFILL", "DECODE_ONLY",
           "DISAGGREGATION_ALWAYS", "DISAGGREGATION_CONDITIONAL"]
