"""The clamp from scaler replicas to applied replicas: min/max, then the ratio, with reasons."""

from __future__ import annotations

import itertools

import pytest

from pdfleet.operator.autoscale.clamp import Bounds, Ratio, clamp

AUTO_P, AUTO_D = Bounds(1, 8), Bounds(1, 16)


def fixed(n: int) -> Bounds:
    return Bounds(n, n)


# (case, requested (p, d), bounds (p, d), ratio, applied (p, d), reason fragments per role)
CASES = [
    ("within everything", (2, 2), (AUTO_P, AUTO_D), Ratio(0.25, 2.0), (2, 2), {}),
    ("above max", (12, 2), (AUTO_P, AUTO_D), Ratio(), (8, 2), {"prefill": "above maxReplicas 8"}),
    ("below min", (0, 0), (AUTO_P, AUTO_D), Ratio(), (1, 1),
     {"prefill": "below minReplicas 1", "decode": "below minReplicas 1"}),
    ("ratio max clamps prefill", (6, 2), (AUTO_P, fixed(2)), Ratio(max=2.0), (4, 2), {"prefill": "ratio max 2 with 2 decode"}),
    ("ratio min raises prefill", (1, 16), (AUTO_P, AUTO_D), Ratio(min=0.25), (4, 16), {"prefill": "ratio min 0.25 with 16 decode"}),
    ("max then ratio", (12, 3), (AUTO_P, fixed(3)), Ratio(max=2.0), (6, 3),
     {"prefill": "above maxReplicas 8; ratio max 2 with 3 decode"}),
    ("decode moves when prefill cannot follow", (2, 16), (fixed(2), AUTO_D), Ratio(min=0.25), (2, 8),
     {"decode": "so decode 16 -> 8"}),
    ("decode moves up when prefill floor too high", (6, 1), (Bounds(6, 8), AUTO_D), Ratio(max=2.0), (6, 3),
     {"decode": "so decode 1 -> 3"}),
    ("fractional ratio rounds inward", (3, 5), (AUTO_P, fixed(5)), Ratio(max=0.5), (2, 5), {"prefill": "ratio max 0.5"}),
    ("exact boundary is kept", (4, 16), (AUTO_P, AUTO_D), Ratio(0.25, 0.25), (4, 16), {}),
    ("no decode allows no prefill under a max", (0, 0), (Bounds(0, 4), Bounds(0, 4)), Ratio(max=1.0), (0, 0), {}),
    ("unmeetable ratio reported, not raised", (3, 2), (fixed(3), fixed(2)), Ratio(max=1.0), (3, 2),
     {}),  # nothing could change, so nothing is clamped; the spec rules refuse such a spec earlier
    ("planner-sized both within", (3, 7), (AUTO_P, AUTO_D), Ratio(0.25, 2.0), (3, 7), {}),
]


@pytest.mark.parametrize("case,req,bounds,ratio,applied,reasons", CASES, ids=[c[0] for c in CASES])
def test_clamp_table(case, req, bounds, ratio, applied, reasons) -> None:
    out = clamp({"prefill": req[0], "decode": req[1]}, {"prefill": bounds[0], "decode": bounds[1]}, ratio)
    assert (out.replicas["prefill"], out.replicas["decode"]) == applied, case
    assert set(out.reasons) == set(reasons), out.reasons
    for role, fragment in reasons.items():
        assert fragment in out.reasons[role], out.reasons[role]
    assert out.clamped is bool(reasons)
    assert out.requested == {"prefill": req[0], "decode": req[1]}


def test_clamp_properties_over_a_grid() -> None:
    """Whenever a pair within bounds meets the ratio, the result is within bounds and meets it,
    and a request that already does is applied unchanged."""
    ratios = [Ratio(), Ratio(0.25, 2.0), Ratio(max=0.5), Ratio(min=1.0), Ratio(0.4, 0.6)]
    checked = 0
    for p_req, d_req, p_lo, d_lo, ratio in itertools.product(range(0, 12), range(0, 12), (0, 1, 3), (1, 2), ratios):
        pb, db = Bounds(p_lo, 8), Bounds(d_lo, 10)
        feasible = [(p, d) for p in range(pb.min, pb.max + 1) for d in range(db.min, db.max + 1)
                    if (ratio.min is None or p >= ratio.min * d - 1e-9) and (ratio.max is None or p <= ratio.max * d + 1e-9)]
        if not feasible:
            continue
        out = clamp({"prefill": p_req, "decode": d_req}, {"prefill": pb, "decode": db}, ratio)
        p, d = out.replicas["prefill"], out.replicas["decode"]
        assert (p, d) in feasible, (p_req, d_req, pb, db, ratio, out)
        if (p_req, d_req) in feasible:
            assert (p, d) == (p_req, d_req) and not out.clamped
        else:
            assert out.clamped
        checked += 1
    assert checked > 1000
