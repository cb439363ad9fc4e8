"""The adapter's layout edge: which layout vLLM resolved, and the fallback when the
attention backend cannot be determined (the decision table is in
tests/unit/transfer/test_transfer_kv_cache_layouts.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from pdfleet.connector.adapter.kv_layout import required_layout, resolved_layout


@pytest.mark.parametrize(
    "kv_cache_config_layout, cache_config_layout, expected",
    [
        ("BHLNC", None, "BHLNC"),  # what the engine core recorded on the KV cache config
        (None, "BLHNC", "BLHNC"),  # ... or on the cache config
        ("BHLNC", "LBHNC", "BHLNC"),
        (None, "HND", "LBHNC"),  # vLLM's legacy aliases
        (None, "NHD", "LBNHC"),
        (None, None, "LBHNC"),  # nothing recorded (older vLLM, tests): layer-outermost
    ],
)
def test_resolved_layout(kv_cache_config_layout, cache_config_layout, expected):
    vllm_config = SimpleNamespace(cache_config=SimpleNamespace(kv_cache_layout=cache_config_layout))
    kv_cache_config = SimpleNamespace(kv_cache_layout=kv_cache_config_layout)
    assert resolved_layout(vllm_config, kv_cache_config) == expected


def test_resolved_layout_rejects_an_unknown_name():
    with pytest.raises(ValueError, match="'XYZ' is not one of"):
        resolved_layout(SimpleNamespace(cache_config=None), SimpleNamespace(kv_cache_layout="XYZ"))


def test_required_layout_falls_back_explicitly_when_the_backend_is_unknown(caplog):
    # a model config the attention selector cannot use: the probe fails
    broken = SimpleNamespace(model_config=SimpleNamespace(use_mla=False), cache_config=SimpleNamespace())
    with caplog.at_level("WARNING", logger="pdfleet.connector.adapter.kv_layout"):
        assert required_layout(broken) == "LBHNC"
    assert "layouts are unknown" in caplog.text and "falling back to LBHNC" in caplog.text
    assert required_layout(SimpleNamespace(model_config=None)) is None


@pytest.mark.parametrize(
    "block_size, sizes, splits",
    [
        (16, [16, 32, 64], False),
        (128, [16, 32, 64], True),  # vLLM would split each 128-token block into kernel blocks
        (128, [SimpleNamespace(base=16)], False),  # MultipleOf(16) accepts 128 itself
        (48, [SimpleNamespace(base=32)], True),
        (None, [16], False),  # not set by the user: vLLM picks a supported size
        (128, [], False),  # no restriction
    ],
)
def test_kernel_split_reason(block_size, sizes, splits):
    from pdfleet.connector.adapter.kv_layout import kernel_split_reason

    reason = kernel_split_reason(block_size, sizes)
    assert bool(reason) is splits
    if splits:
        assert f"block_size {block_size}" in reason
