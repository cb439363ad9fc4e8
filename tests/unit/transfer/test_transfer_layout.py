"""Table tests of the pure planning code: validation, TP slices, run coalescing, descriptors."""

from __future__ import annotations

import numpy as np
import pytest

from pdfleet.connector.transfer.descriptors import build_descriptors, coalesce_runs, validate_block_ids
from pdfleet.connector.transfer.layout import (
    IncompatibleLayout,
    InvalidBlockIds,
    KVLayout,
    Region,
    SlicePlan,
    plan_slice,
    remote_rank_for,
)


def layout(**kw) -> KVLayout:
    fields = dict(block_size=16, dtype="bfloat16", layout="HND", num_kv_heads=4, head_dim=64, tp_rank=0, tp_size=1)
    fields.update(kw)
    return KVLayout(**fields)


def region(base: int = 1 << 20, n: int = 100, block_len: int = 256, stride: int | None = None, device="DRAM") -> Region:
    return Region(base=base, num_blocks=n, block_stride=stride or block_len, block_len=block_len, device=device)


@pytest.mark.parametrize(
    "local, remote, runs",
    [
        ([0, 1, 2, 3], [10, 11, 12, 13], [(0, 10, 4)]),
        ([0, 1, 2, 3], [10, 11, 13, 14], [(0, 10, 2), (2, 13, 2)]),  # remote gap splits
        ([0, 2, 3], [5, 6, 7], [(0, 5, 1), (2, 6, 2)]),  # local gap splits
        ([3, 2, 1], [3, 2, 1], [(3, 3, 1), (2, 2, 1), (1, 1, 1)]),  # descending never merges
        ([7], [9], [(7, 9, 1)]),
        ([], [], []),
        ([0, 1, 5, 6, 7, 20], [0, 1, 2, 3, 4, 5], [(0, 0, 2), (5, 2, 3), (20, 5, 1)]),
    ],
)
def test_coalesce_runs(local, remote, runs):
    assert coalesce_runs(local, remote) == runs


@pytest.mark.parametrize(
    "remote, local, nlocal, nremote, message",
    [
        ([1, 2], [1], 10, None, "lengths must match"),
        ([-1], [0], 10, None, "remote_block_ids[0] = -1"),
        ([0], [10], 10, None, "local_block_ids[0] = 10: out of range"),
        ([0, 50], [0, 1], 10, 20, "remote_block_ids[1] = 50: out of range"),
        ([0, "1"], [0, 1], 10, None, "remote_block_ids[1] must be an int, got str"),
        ([0, 1.0], [0, 1], 10, None, "must be an int, got float"),
        ([True], [0], 10, None, "must be an int, got bool"),
        ("01", [0, 1], 10, None, "remote_block_ids must be a list of ints, got str"),
        (None, [0], 10, None, "got NoneType"),
        ([], [], 10, None, "empty"),
        ([0, 1], [3, 3], 10, None, "duplicates"),
    ],
)
def test_validate_block_ids_rejects(remote, local, nlocal, nremote, message):
    with pytest.raises(InvalidBlockIds) as err:
        validate_block_ids(remote, local, local_num_blocks=nlocal, remote_num_blocks=nremote)
    assert message in str(err.value)


def test_validate_block_ids_accepts_numpy_ints_and_tuples():
    remote, local = validate_block_ids((np.int64(3), 4), [np.int32(0), 9], local_num_blocks=10, remote_num_blocks=5)
    assert remote == [3, 4] and local == [0, 9]
    assert all(type(x) is int for x in remote + local)


@pytest.mark.parametrize(
    "local_tp, remote_tp, expected",
    [((0, 1), 1, 0), ((3, 4), 4, 3), ((3, 4), 2, 1), ((2, 4), 2, 1), ((1, 4), 2, 0), ((3, 4), 1, 0)],
)
def test_remote_rank_for(local_tp, remote_tp, expected):
    rank, size = local_tp
    assert remote_rank_for(layout(tp_rank=rank, tp_size=size, num_kv_heads=1), remote_tp) == expected


@pytest.mark.parametrize("remote_tp", [3, 8, 0, -1])
def test_remote_rank_for_rejects(remote_tp):
    with pytest.raises(IncompatibleLayout):
        remote_rank_for(layout(tp_rank=1, tp_size=4, num_kv_heads=1), remote_tp)


def test_plan_equal_tp_reads_whole_blocks():
    plan = plan_slice(layout(), [region()], layout(), [region(base=1 << 30)])
    assert plan == SlicePlan(offsets=(0,), lengths=(256,), readers=1, reader_index=0)
    assert plan.whole_blocks


def test_plan_heterogeneous_tp_reads_head_slices():
    # prefill TP1 with 4 heads; decode TP2 with 2 heads per rank: rank 1 reads the second half.
    prefill = layout(num_kv_heads=4)
    remote = [region(block_len=512), region(block_len=512)]
    decode1 = layout(num_kv_heads=2, tp_rank=1, tp_size=2)
    plan = plan_slice(decode1, [region(block_len=256)] * 2, prefill, remote)
    assert plan == SlicePlan(offsets=(256, 256), lengths=(256, 256), readers=2, reader_index=1)
    decode0 = layout(num_kv_heads=2, tp_rank=0, tp_size=2)
    assert plan_slice(decode0, [region(block_len=256)] * 2, prefill, remote).offsets == (0, 0)


def test_plan_mla_reads_whole_blocks_from_rank_r_div_k():
    prefill = layout(tp_rank=1, tp_size=2, is_mla=True, num_kv_heads=1)
    decode = layout(tp_rank=3, tp_size=4, is_mla=True, num_kv_heads=1)
    plan = plan_slice(decode, [region()], prefill, [region()])
    assert plan == SlicePlan(offsets=(0,), lengths=(256,), readers=2, reader_index=1)


@pytest.mark.parametrize(
    "local_kw, remote_kw, local_len, remote_len, message",
    [
        ({"dtype": "float16"}, {}, 256, 256, "KVLayout.dtype differs"),
        ({"block_size": 32}, {}, 256, 256, "KVLayout.block_size differs"),
        ({"head_dim": 128}, {}, 256, 256, "KVLayout.head_dim differs"),
        ({"is_mla": True}, {}, 256, 256, "KVLayout.is_mla differs"),
        ({}, {}, 256, 512, "block_len differs"),
        ({"num_kv_heads": 2}, {}, 256, 256, "num_kv_heads differs at equal TP"),
        ({"num_kv_heads": 2, "tp_size": 2, "layout": "NHD"}, {"layout": "NHD"}, 256, 512, "needs layout 'HND'"),
        ({"num_kv_heads": 1, "tp_size": 2}, {}, 256, 512, "replicated KV heads"),
        ({"num_kv_heads": 2, "tp_size": 2}, {}, 256, 1024, "prefill block_len 1024 != decode block_len 256 x 2"),
        ({"tp_size": 2, "tp_rank": 1, "num_kv_heads": 2}, {"tp_size": 2, "tp_rank": 0}, 256, 256,
         "must read prefill rank 1"),
        ({"tp_size": 1}, {"tp_size": 2}, 256, 256, "not a multiple"),
    ],
)
def test_plan_rejects(local_kw, remote_kw, local_len, remote_len, message):
    with pytest.raises(IncompatibleLayout) as err:
        plan_slice(layout(**local_kw), [region(block_len=local_len)], layout(**remote_kw), [region(block_len=remote_len)])
    assert message in str(err.value)


def test_plan_rejects_region_count_mismatch():
    with pytest.raises(IncompatibleLayout, match="region count differs"):
        plan_slice(layout(), [region()], layout(), [region(), region()])


def test_descriptors_coalesce_dense_runs():
    local = [region(base=0x10000), region(base=0x90000)]
    remote = [region(base=0x100000), region(base=0x900000)]
    plan = plan_slice(layout(), local, layout(), remote)
    groups = build_descriptors(local, remote, plan, [0, 1, 2, 10], [5, 6, 7, 20])
    assert len(groups) == 1
    lmem, rmem, loc, rem = groups[0]
    assert (lmem, rmem) == ("DRAM", "DRAM")
    # 2 regions x 2 runs, not 2 x 4 blocks
    assert loc.tolist() == [
        [0x10000, 3 * 256, 0], [0x10000 + 10 * 256, 256, 0],
        [0x90000, 3 * 256, 0], [0x90000 + 10 * 256, 256, 0],
    ]
    assert rem.tolist() == [
        [0x100000 + 5 * 256, 3 * 256, 0], [0x100000 + 20 * 256, 256, 0],
        [0x900000 + 5 * 256, 3 * 256, 0], [0x900000 + 20 * 256, 256, 0],
    ]


def test_descriptors_scattered_ids_are_one_per_block():
    local, remote = [region(base=0x10000)], [region(base=0x100000)]
    plan = plan_slice(layout(), local, layout(), remote)
    (_, _, loc, rem), = build_descriptors(local, remote, plan, [0, 2, 4, 6], [1, 3, 5, 7])
    assert len(loc) == len(rem) == 4
    assert int(loc[:, 1].sum()) == 4 * 256


def test_descriptors_do_not_merge_strided_blocks():
    # K and V interleaved per block: stride 512, 256 bytes of KV each; merging would copy the gaps.
    local, remote = [region(base=0x10000, stride=512)], [region(base=0x100000, stride=512)]
    plan = plan_slice(layout(), local, layout(), remote)
    (_, _, loc, rem), = build_descriptors(local, remote, plan, [0, 1, 2], [0, 1, 2])
    assert loc.tolist() == [[0x10000, 256, 0], [0x10000 + 512, 256, 0], [0x10000 + 1024, 256, 0]]
    assert rem[:, 0].tolist() == [0x100000, 0x100000 + 512, 0x100000 + 1024]


def test_descriptors_head_slice_offsets():
    prefill = layout(num_kv_heads=4)
    decode = layout(num_kv_heads=2, tp_rank=1, tp_size=2)
    local, remote = [region(base=0x10000, block_len=256)], [region(base=0x100000, block_len=512)]
    plan = plan_slice(decode, local, prefill, remote)
    (_, _, loc, rem), = build_descriptors(local, remote, plan, [0, 1], [4, 5])
    assert loc.tolist() == [[0x10000, 256, 0], [0x10000 + 256, 256, 0]]  # contiguous locally, but
    assert rem.tolist() == [[0x100000 + 4 * 512 + 256, 256, 0], [0x100000 + 5 * 512 + 256, 256, 0]]


def test_descriptors_group_by_memory_type():
    local = [region(base=0x10000), region(base=0x90000, device="VRAM")]
    remote = [region(base=0x100000), region(base=0x900000)]
    plan = plan_slice(layout(), local, layout(), remote)
    groups = build_descriptors(local, remote, plan, [0, 1], [0, 1])
    assert sorted((g[0], g[1], len(g[2])) for g in groups) == [("DRAM", "DRAM", 1), ("VRAM", "DRAM", 1)]
    assert all(g[2].dtype == np.uint64 and g[2].shape[1] == 3 for g in groups)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(base=0), "Region.base must be a positive address"),
        (dict(num_blocks=0), "Region.num_blocks must be > 0"),
        (dict(block_len=0), "Region.block_len must be > 0"),
        (dict(block_stride=10, block_len=20), "block_stride (10) must be >= block_len (20)"),
        (dict(device="GPU"), "Region.device must be one of"),
        (dict(base=1.5), "Region.base must be an int"),
    ],
)
def test_region_validation(kw, message):
    fields = dict(base=4096, num_blocks=4, block_stride=64, block_len=64)
    fields.update(kw)
    with pytest.raises(ValueError) as err:
        Region(**fields)
    assert message in str(err.value)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(layout="XYZ"), "KVLayout.layout must be one of"),
        (dict(tp_rank=2, tp_size=2), "KVLayout.tp_rank must be in [0, tp_size=2)"),
        (dict(block_size=0), "KVLayout.block_size must be > 0"),
        (dict(dtype=""), "KVLayout.dtype must be a non-empty string"),
        (dict(is_mla=1), "KVLayout.is_mla must be a bool"),
    ],
)
def test_layout_validation(kw, message):
    with pytest.raises(ValueError) as err:
        layout(**kw)
    assert message in str(err.value)


def test_region_nbytes_and_dense():
    r = Region(base=4096, num_blocks=4, block_stride=100, block_len=60)
    assert r.nbytes == 3 * 100 + 60 and not r.dense
    assert Region(base=4096, num_blocks=4, block_stride=60, block_len=60).dense


@pytest.mark.parametrize("seed", range(5))
def test_descriptors_cover_exactly_the_requested_blocks(seed):
    """Coalesced descriptors copy the same bytes, pairwise, as one descriptor per block."""
    rng = np.random.default_rng(seed)
    local = [region(base=0x10000, n=64), region(base=0x90000, n=64)]
    remote = [region(base=0x100000, n=64), region(base=0x900000, n=64)]
    plan = plan_slice(layout(), local, layout(), remote)
    # runs of random length at random places
    remote_ids = [int(x) for x in rng.permutation(64)[:20]]
    remote_ids = sorted(remote_ids)[:10] + remote_ids[10:]
    local_ids = [int(x) for x in rng.permutation(64)[:20]]
    local_ids = sorted(local_ids)[:10] + local_ids[10:]
    (_, _, loc, rem), = build_descriptors(local, remote, plan, local_ids, remote_ids)

    def expand(rows):  # byte-granular pairs would be huge: expand to 256-byte blocks instead
        out = []
        for addr, length, _ in rows.tolist():
            out += [addr + k * 256 for k in range(length // 256)]
        return out

    expected_loc = [r.base + b * 256 for r in local for b in local_ids]
    expected_rem = [r.base + b * 256 for r in remote for b in remote_ids]
    assert expand(loc) == expected_loc and expand(rem) == expected_rem
    assert len(loc) == 2 * len(coalesce_runs(local_ids, remote_ids)) <= 2 * len(local_ids)
