"""The `--smoke` table: figures per engine from /metrics text, and its layout."""

from __future__ import annotations

import pytest

from pdfleet.operator.local.smoke_report import EngineFigures, engine_figures, format_table, human_bytes

DECODE = """\
# TYPE vllm:prompt_tokens_by_source counter
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 26.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 256.0
vllm:prompt_tokens_by_source_total{engine="1",model_name="m",source="external_kv_transfer"} 64.0
# TYPE vllm:request_success counter
vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 3.0
vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 1.0
# TYPE vllm:pdfleet_connector_pull_bytes counter
vllm:pdfleet_connector_pull_bytes_total{engine="0",model_name="m"} 5242880.0
# TYPE vllm:pdfleet_connector_pull_seconds counter
vllm:pdfleet_connector_pull_seconds_total{engine="0",model_name="m"} 0.002
# TYPE vllm:pdfleet_connector_pulls counter
vllm:pdfleet_connector_pulls_total{engine="0",model_name="m"} 3.0
# TYPE vllm:pdfleet_connector_pull_failures counter
vllm:pdfleet_connector_pull_failures_total{engine="0",model_name="m"} 1.0
# TYPE vllm:pdfleet_connector_handshakes_rejected counter
vllm:pdfleet_connector_handshakes_rejected_total{engine="0",model_name="m"} 2.0
"""
ROUTER = """\
# TYPE pdfleet_router_requests counter
pdfleet_router_requests_total{code="200",route="/v1/completions"} 3.0
pdfleet_router_requests_total{code="200",route="/v1/chat/completions"} 1.0
pdfleet_router_requests_total{code="503",route="/v1/completions"} 2.0
# TYPE pdfleet_router_fallbacks counter
pdfleet_router_fallbacks_total{reason="prefill_failed"} 1.0
"""


def test_engine_figures():
    f = engine_figures("decode-0", "decode", DECODE)
    assert f.requests == 4
    assert f.tokens == {"local_compute": 26, "external_kv_transfer": 320}   # summed over engine labels
    assert (f.kv_bytes, f.pulls, f.failures) == (5242880, 3, 3)
    assert f.gb_per_s == pytest.approx(5242880 / 0.002 / 1e9)
    assert engine_figures("p", "prefill", "").gb_per_s is None               # no pulls: no rate
    assert not engine_figures("p", "prefill", None).available


def test_table():
    lines = format_table([engine_figures("decode-0", "decode", DECODE), EngineFigures("prefill-0", "prefill", False)],
                         ROUTER)
    assert lines[0].split() == ["engine", "role", "requests", "prompt", "computed", "prompt", "cached", "prompt", "by",
                                "KV", "KV", "pulled", "pulls", "GB/s", "failures"]
    assert lines[1].split() == ["decode-0", "decode", "4", "26", "0", "320", "5.2", "MB", "3", "2.62", "3"]
    assert lines[2].split() == ["prefill-0", "prefill", "/metrics", "unavailable"]
    assert lines[3] == "router: requests by code 200: 4, 503: 2; fallbacks 1; retries 0"
    assert len({len(line) for line in lines[:2]}) == 1  # aligned columns


def test_decode_alone_by_choice_makes_the_rows_add_up():
    """Under Conditional: decode's requests = prefill's + fallbacks + decode alone by choice."""
    router = ROUTER + '''\
# TYPE pdfleet_router_disaggregation_decisions counter
pdfleet_router_disaggregation_decisions_total{decision="decode_only",reason="short_prompt"} 2.0
pdfleet_router_disaggregation_decisions_total{decision="decode_only",reason="fan_out"} 1.0
pdfleet_router_disaggregation_decisions_total{decision="remote_prefill",reason="long_uncached"} 1.0
'''
    lines = format_table([engine_figures("decode-0", "decode", DECODE)], router)
    assert lines[-1] == "router: requests by code 200: 4, 503: 2; fallbacks 1; retries 0; decode alone by choice 2"
    # negative control: without the counter (Always, or an older router) the line is as before
    assert format_table([], ROUTER)[-1].endswith("retries 0")


@pytest.mark.parametrize("n, text", [(0, "0 B"), (999, "999 B"), (5242880, "5.2 MB"), (3.2e9, "3.2 GB"), (4e12, "4000.0 GB")])
def test_human_bytes(n, text):
    assert human_bytes(n) == text
