"""Scaler replicas to applied replicas (pure): min/max per role, then the prefill:decode ratio.

Decode is the anchor of the ratio: it holds the streams and their KV, and the ratio is
written as prefill per decode. So prefill is clamped into what the decode size allows;
decode moves only when no prefill size within prefill's own bounds can meet the ratio
at decode's size (then to the nearest decode size where one can). Every change comes
with a reason that names the bound, for the scaler's status, the fleet's condition and
an event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Mapping, Optional

ROLES = ("prefill", "decode")
EPS = 1e-9


@dataclass(frozen=True)
class Bounds:
    min: int
    max: int


@dataclass(frozen=True)
class Ratio:
    min: Optional[float] = None
    max: Optional[float] = None

    def prefill_range(self, decode: int, bounds: Bounds) -> tuple[int, int]:
        """Prefill sizes within `bounds` that meet the ratio at this decode size (empty when low > high)."""
        low = bounds.min if self.min is None else max(bounds.min, math.ceil(self.min * decode - EPS))
        high = bounds.max if self.max is None else min(bounds.max, math.floor(self.max * decode + EPS))
        return low, high


@dataclass(frozen=True)
class Clamped:
    replicas: dict[str, int]
    requested: dict[str, int]
    reasons: dict[str, str] = field(default_factory=dict)   # role -> why replicas != requested

    @property
    def clamped(self) -> bool:
        return any(self.reasons.values())


def _fmt(x: float) -> str:
    return f"{x:g}"


def _within(value: int, b: Bounds) -> tuple[int, str]:
    if value > b.max:
        return b.max, f"above maxReplicas {b.max}"
    if value < b.min:
        return b.min, f"below minReplicas {b.min}"
    return value, ""


def clamp(requested: Mapping[str, int], bounds: Mapping[str, Bounds], ratio: Ratio = Ratio()) -> Clamped:
    """Applied replicas for prefill and decode.

    `bounds` of a role without autoscaling is (replicas, replicas): fixed. The spec's rules
    guarantee some pair meets the ratio; if none does (a spec that slipped past them), the
    ratio is left unmet and said so, never an exception in the reconcile.
    """
    p_b, d_b = bounds["prefill"], bounds["decode"]
    p, p_why = _within(requested["prefill"], p_b)
    d, d_why = _within(requested["decode"], d_b)

    low, high = ratio.prefill_range(d, p_b)
    if low > high:  # decode's size leaves prefill no room: move decode to the nearest size that does
        candidates = [x for x in range(d_b.min, d_b.max + 1) if ratio.prefill_range(x, p_b)[0] <= ratio.prefill_range(x, p_b)[1]]
        if candidates:
            new_d = min(candidates, key=lambda x: (abs(x - d), -x))
            d_why = _join(d_why, f"ratio {_ratio_text(ratio)}: prefill can have {p_b.min}..{p_b.max}, "
                                 f"so decode {d} -> {new_d}")
            d = new_d
            low, high = ratio.prefill_range(d, p_b)
        else:
            d_why = _join(d_why, f"ratio {_ratio_text(ratio)} cannot be met within the bounds")
            low, high = p_b.min, p_b.max
    if p > high:
        p, p_why = high, _join(p_why, f"ratio max {_fmt(ratio.max)} with {d} decode" if ratio.max is not None and
                                high < p_b.max else f"above maxReplicas {p_b.max}")
    elif p < low:
        p, p_why = low, _join(p_why, f"ratio min {_fmt(ratio.min)} with {d} decode" if ratio.min is not None and
                              low > p_b.min else f"below minReplicas {p_b.min}")
    req = {"prefill": requested["prefill"], "decode": requested["decode"]}
    reasons = {role: why for role, why in (("prefill", p_why), ("decode", d_why)) if why}
    # a reason whose value landed back on the request (moved, then moved back) is no clamp
    reasons = {role: why for role, why in reasons.items() if {"prefill": p, "decode": d}[role] != req[role]}
    return Clamped({"prefill": p, "decode": d}, req, reasons)


def _ratio_text(r: Ratio) -> str:
    return f"[{'' if r.min is None else _fmt(r.min)}, {'' if r.max is None else _fmt(r.max)}]"


def _join(a: str, b: str) -> str:
    return f"{a}; {b}" if a else b
