"""Table tests of the physical-layout decisions: which layout to ask for, layout
compatibility in the handshake, registration per allocation, descriptors per layout."""

from __future__ import annotations

import pytest

from pdfleet.connector.transfer.descriptors import build_descriptors
from pdfleet.connector.transfer.layout import (
    IncompatibleLayout,
    KVLayout,
    Region,
    Span,
    choose_kv_cache_layout,
    plan_slice,
    registration_spans,
)


@pytest.mark.parametrize(
    "supported, layout, fallback",
    [
        (None, "BHLNC", False),  # FlashAttention: no restriction
        (("LBHNC", "BLHNC", "BHLNC"), "BHLNC", False),  # BHLNC wins over the backend's own first choice
        (("BLHNC", "BHLNC"), "BHLNC", False),
        (("LBHNC", "BLHNC"), "BLHNC", False),  # FlashInfer: no BHLNC
        (("BLHNC",), "BLHNC", False),
        (("LBHNC",), "LBHNC", True),  # vLLM's CPU backend: explicit fallback
        (("LHBNC", "LBHNC"), "LBHNC", True),  # ROCm: LBHNC even when not first
        (("LBNHC",), "LBNHC", True),  # flex attention: neither, the backend's own choice
        (("BLNHC", "LBNHC"), "BLNHC", True),
    ],
)
def test_choose_kv_cache_layout(supported, layout, fallback):
    choice = choose_kv_cache_layout(supported)
    assert (choice.layout, choice.fallback) == (layout, fallback)
    assert choice.reason
    if fallback:
        assert "fall" in choice.reason or "first choice" in choice.reason


@pytest.mark.parametrize("supported, message", [((), "no KV cache layout"), (("HND",), "unknown KV cache layout")])
def test_choose_kv_cache_layout_rejects(supported, message):
    with pytest.raises(ValueError, match=message):
        choose_kv_cache_layout(supported)


def layout(**kw) -> KVLayout:
    fields = dict(block_size=16, dtype="bfloat16", layout="HND", num_kv_heads=4, head_dim=64, tp_rank=0, tp_size=1)
    fields.update(kw)
    return KVLayout(**fields)


def test_kv_cache_layout_defaults_to_lbhnc_and_is_validated():
    assert layout().kv_cache_layout == "LBHNC"
    with pytest.raises(ValueError, match="kv_cache_layout must be one of"):
        layout(kv_cache_layout="HND")


@pytest.mark.parametrize(
    "local_kw, remote_kw, message",
    [
        # a physical layout mismatch is refused with both names, never read per layer
        ({"kv_cache_layout": "BHLNC"}, {"kv_cache_layout": "LBHNC"}, "kv_cache_layout differs: decode 'BHLNC', prefill 'LBHNC'"),
        ({"kv_cache_layout": "BLHNC"}, {"kv_cache_layout": "BHLNC"}, "kv_cache_layout differs"),
        # heterogeneous TP needs head-major blocks: BLHNC pages hold layers outside heads
        ({"kv_cache_layout": "BLHNC", "tp_size": 2, "num_kv_heads": 2},
         {"kv_cache_layout": "BLHNC", "num_kv_heads": 4}, "needs a physical layout in"),
    ],
)
def test_plan_refuses_layouts(local_kw, remote_kw, message):
    with pytest.raises(IncompatibleLayout, match=message):
        plan_slice(layout(**local_kw), [], layout(**remote_kw), [])


def page(block_len: int, base: int = 1 << 20, n: int = 64) -> Region:
    return Region(base=base, num_blocks=n, block_stride=block_len, block_len=block_len)


def test_bhlnc_heterogeneous_tp_reads_one_head_slice_per_block():
    # prefill page [H=4, L, N, C]; decode rank 1 of 2 holds heads 2..3: the second half
    lp, rp = page(2 * 1024), page(4 * 1024, base=1 << 30)
    plan = plan_slice(layout(kv_cache_layout="BHLNC", tp_size=2, tp_rank=1, num_kv_heads=2), [lp],
                      layout(kv_cache_layout="BHLNC", num_kv_heads=4), [rp])
    assert (plan.offsets, plan.lengths, plan.readers, plan.reader_index) == ((2048,), (2048,), 2, 1)
    [(_, _, loc, rem)] = build_descriptors([lp], [rp], plan, [0, 1, 2], [5, 6, 7])
    assert loc.shape[0] == 3  # one per block (slices are strided)
    assert [int(a) - rp.base for a in rem[:, 0]] == [5 * 4096 + 2048, 6 * 4096 + 2048, 7 * 4096 + 2048]
    assert set(rem[:, 1].tolist()) == {2048}


@pytest.mark.parametrize(
    "regions, ids, expected",
    [
        # block-outermost: one region (all layers' pages), one descriptor per run
        ([page(64 * 1024)], ([0, 1, 2, 3, 8, 9], [4, 5, 6, 7, 20, 21]), 2),
        # per-layer (LBHNC): one region per layer: layers x runs
        ([page(2048, base=(1 + i) << 24) for i in range(32)], ([0, 1, 2, 3, 8, 9], [4, 5, 6, 7, 20, 21]), 64),
        ([page(64 * 1024)], (list(range(128)), list(range(128))), 1),
    ],
)
def test_descriptor_counts_per_layout(regions, ids, expected):
    plan = plan_slice(layout(), regions, layout(), regions)
    groups = build_descriptors(regions, regions, plan, *ids)
    assert sum(g[2].shape[0] for g in groups) == expected


def test_registration_spans_one_per_backing_allocation():
    backing = [Span(1 << 20, 1 << 20), Span(1 << 30, 4096, "VRAM", 0)]
    layers = [Region(base=(1 << 20) + i * 8192, num_blocks=4, block_stride=2048, block_len=2048) for i in range(32)]
    assert registration_spans(layers, backing) == [backing[0]]
    vram = Region(base=1 << 30, num_blocks=2, block_stride=2048, block_len=2048, device="VRAM")
    assert registration_spans([*layers, vram], backing) == backing
    with pytest.raises(ValueError, match="region 0 .* lies in none"):
        registration_spans([Region(base=1 << 40, num_blocks=1, block_stride=8, block_len=8)], backing)


def test_registration_spans_without_backing_merge_only_overlaps():
    a = Region(base=1 << 20, num_blocks=4, block_stride=2048, block_len=1024)  # strided views of one buffer
    b = Region(base=(1 << 20) + 1024, num_blocks=4, block_stride=2048, block_len=1024)
    c = Region(base=(1 << 20) + 4 * 2048, num_blocks=1, block_stride=8, block_len=8)  # touches, separate
    spans = registration_spans([c, b, a])
    assert spans == [Span(1 << 20, 4 * 2048, "DRAM", 0), Span((1 << 20) + 4 * 2048, 8, "DRAM", 0)]


@pytest.mark.parametrize(
    "supported, layout",
    [
        (None, "LBHNC"),  # any layout: still layer-outermost when blocks are split into kernel blocks
        (("LBHNC", "BLHNC", "BHLNC"), "LBHNC"),
        (("BLHNC", "LBNHC"), "LBNHC"),
    ],
)
def test_kernel_block_splitting_rules_out_block_outermost(supported, layout):
    choice = choose_kv_cache_layout(supported, kernel_split="block_size 128 is not a kernel block size")
    assert (choice.layout, choice.fallback) == (layout, True)
    assert "cannot be split into kernel blocks" in choice.reason
    with pytest.raises(ValueError, match="only block-outermost"):
        choose_kv_cache_layout(("BLHNC", "BHLNC"), kernel_split="split")
