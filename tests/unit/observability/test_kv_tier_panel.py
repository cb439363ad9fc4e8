"""The dashboard's per-tier hit tokens (issue 40 part 4): its query, evaluated on a recording of what vLLM exports
(vllm:prompt_tokens_cached_by_source_total, its source label), shows host-tier hits per role; negative control:
an engine without the tier exports host at 0 and the panel shows 0 for it."""

from __future__ import annotations

from observability_assets import load_dashboard

from pdfleet.contract.kv_offload import HOST_SOURCE
from pdfleet.operator.observability.evaluate import Evaluator, Recording

TITLE = "Cached prompt tokens by tier"
METRIC = "vllm:prompt_tokens_cached_by_source_total"


def query() -> str:
    panel = next(p for p in load_dashboard()["panels"] if p["title"] == TITLE)
    (target,) = panel["targets"]
    return target["expr"]


def recording() -> Recording:
    r = Recording()
    fleet = {"namespace": "ns", "fleet": "f"}
    for t in range(0, 70, 10):
        # decode with the tier: 20 host tokens/s, 5 device tokens/s; prefill without it: host stays 0
        r.add(t, METRIC, {**fleet, "role": "decode", "pod": "d-0", "source": HOST_SOURCE}, 20.0 * t)
        r.add(t, METRIC, {**fleet, "role": "decode", "pod": "d-0", "source": "device"}, 5.0 * t)
        r.add(t, METRIC, {**fleet, "role": "prefill", "pod": "p-0", "source": HOST_SOURCE}, 0.0)
        r.add(t, METRIC, {**fleet, "role": "prefill", "pod": "p-0", "source": "device"}, 8.0 * t)
        r.add(t, METRIC, {"namespace": "other", "fleet": "g", "role": "decode", "pod": "x", "source": HOST_SOURCE},
              99.0 * t)  # another fleet: filtered out
    return r


def test_the_panel_shows_host_hits_per_role() -> None:
    got = Evaluator(recording(), {"namespace": "ns", "fleet": "f"}).query(query(), 60, rate_interval="30s")
    by = {tuple(v for _, v in k): round(x, 6) for k, x in got.items()}
    assert by == {("decode", HOST_SOURCE): 20.0, ("decode", "device"): 5.0,
                  ("prefill", HOST_SOURCE): 0.0, ("prefill", "device"): 8.0}
