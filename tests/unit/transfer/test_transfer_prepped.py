"""Table tests of prepared descriptor lists (connector/transfer/prepped.py): the indices a pull
names select exactly the bytes ``build_descriptors`` would read, grouped and counted alike."""

from __future__ import annotations

import numpy as np
import pytest

from pdfleet.connector.transfer.descriptors import build_descriptors
from pdfleet.connector.transfer.layout import Region, SlicePlan
from pdfleet.connector.transfer.prepped import local_rows, pull_indices, read_groups, remote_rows


def region(base: int, n: int = 64, block_len: int = 256, stride: int = 0, device: str = "DRAM") -> Region:
    return Region(base=base, num_blocks=n, block_stride=stride or block_len, block_len=block_len, device=device)


def whole(regions) -> SlicePlan:
    return SlicePlan(tuple(0 for _ in regions), tuple(r.block_len for r in regions), 1, 0)


def flat(rows: np.ndarray) -> np.ndarray:
    """NIXL's expansion of Nx5 strided rows into one (address, length) entry per block."""
    out = [(int(a) + k * int(s), int(n)) for a, n, _, s, c in rows for k in range(int(c))]
    return np.array(out, dtype=np.int64).reshape(-1, 2)


def per_block(groups) -> list[tuple[str, str, list[tuple[int, int, int]]]]:
    """build_descriptors' rows cut into blocks: (local addr, remote addr, length) per block."""
    out = []
    for lm, rm, loc, rem in groups:
        entries = []
        for (la, ln, _), (ra, _, _) in zip(loc.tolist(), rem.tolist()):
            entries.append((la, ra, ln))
        out.append((lm, rm, entries))
    return out


# (local regions, remote regions, plan, local ids, remote ids)
L0, R0 = 1 << 30, 1 << 34
CASES = {
    "block-outermost, runs of 2": ([region(L0, 16, 8192)], [region(R0, 32, 8192)], None,
                                   [0, 1, 2, 3, 8, 9], [4, 5, 20, 21, 10, 11]),
    "block-outermost, one run": ([region(L0, 16, 8192)], [region(R0, 32, 8192)], None, list(range(16)),
                                 list(range(16, 32))),
    "block-outermost, scattered": ([region(L0, 16, 8192)], [region(R0, 32, 8192)], None, [0, 1, 2, 3],
                                   [9, 3, 30, 4]),
    "per layer, 4 regions": ([region(L0 + i * 64 * 256) for i in range(4)],
                             [region(R0 + i * 64 * 256) for i in range(4)], None,
                             [0, 1, 2, 10, 11, 30], [5, 6, 7, 40, 41, 2]),
    "per layer, descending ids": ([region(L0 + i * 64 * 256) for i in range(2)],
                                  [region(R0 + i * 64 * 256) for i in range(2)], None, [3, 2, 1], [3, 2, 1]),
    "padded blocks never merge": ([region(L0, 64, 256, stride=512)], [region(R0, 64, 256, stride=512)], None,
                                  [0, 1, 2], [0, 1, 2]),
    "head slice 2/2 (TP 1 -> 2)": ([region(L0, 64, 128), region(L0 + 64 * 128, 64, 128)],
                                   [region(R0, 64, 256), region(R0 + 64 * 256, 64, 256)],
                                   SlicePlan((128, 128), (128, 128), 2, 1), [0, 1, 2], [4, 5, 6]),
    "head slice 1/2 (offset 0)": ([region(L0, 64, 128)], [region(R0, 64, 256)], SlicePlan((0,), (128,), 2, 0),
                                  [0, 1], [0, 1]),
    "VRAM and DRAM regions": ([region(L0, device="VRAM"), region(L0 + (1 << 20)), region(L0 + (2 << 20), device="VRAM")],
                              [region(R0, device="VRAM"), region(R0 + (1 << 20)), region(R0 + (2 << 20), device="VRAM")],
                              None, [0, 1, 7], [2, 3, 9]),
}


@pytest.mark.parametrize("case", CASES)
def test_indices_read_what_build_descriptors_reads(case):
    local, remote, plan, lids, rids = CASES[case]
    plan = plan or whole(local)
    lrows, rrows = local_rows(local), remote_rows(remote, plan)
    reads = pull_indices(read_groups(lrows, rrows), lids, rids)
    want = build_descriptors(local, remote, plan, lids, rids)
    assert [(r.local_mem, r.remote_mem) for r in reads] == [(lm, rm) for lm, rm, _, _ in want]
    for read, (lm, rm, loc, rem) in zip(reads, want):
        assert read.local.dtype == read.remote.dtype == np.int32
        got_l, got_r = flat(lrows.rows[lm])[read.local], flat(rrows.rows[rm])[read.remote]
        assert (got_l[:, 1] == got_r[:, 1]).all()
        # the same bytes: every block of build_descriptors' rows, in the same order
        blocks = [(la + k, ra + k) for (la, ln, _), (ra, _, _) in zip(loc.tolist(), rem.tolist())
                  for k in range(0, ln, int(got_l[0, 1]))]
        assert list(zip(got_l[:, 0].tolist(), got_r[:, 0].tolist())) == blocks
        assert read.descriptors == len(loc)  # NIXL merges into as many descriptors as build_descriptors has
        assert read.nbytes == int(loc[:, 1].sum())


def test_rows_are_one_strided_row_per_region_and_memory_type():
    local = [region(L0, 10, 256), region(L0 + 4096, 20, 128, stride=256, device="VRAM"), region(L0 + 9000, 5, 64)]
    rows = local_rows(local)
    assert sorted(rows.rows) == ["DRAM", "VRAM"]
    assert rows.rows["DRAM"].tolist() == [[L0, 256, 0, 256, 10], [L0 + 9000, 64, 0, 64, 5]]
    assert rows.rows["VRAM"].tolist() == [[L0 + 4096, 128, 0, 256, 20]]
    assert rows.region_base == (0, 0, 10)  # flat index of block 0 in its memory type's list
    plan = SlicePlan((0, 64, 0), (256, 64, 32), 1, 0)
    assert remote_rows(local, plan).rows["VRAM"].tolist() == [[L0 + 4096 + 64, 64, 0, 256, 20]]


@pytest.mark.parametrize("plan, message", [
    (SlicePlan((0,), (512,), 1, 0), "does not fit a block of 256"),
    (SlicePlan((200,), (100,), 1, 0), "does not fit"),
    (SlicePlan((0, 0), (256, 256), 1, 0), "the plan covers 2 regions, the peer has 1"),
])
def test_remote_rows_reject_a_plan_that_does_not_fit(plan, message):
    with pytest.raises(ValueError, match=message):
        remote_rows([region(R0)], plan)


def test_pull_indices_reject_mismatched_sides():
    a, b = local_rows([region(L0)]), local_rows([region(R0, block_len=128)])
    with pytest.raises(ValueError, match="local reads 256 bytes per block, remote 128"):
        read_groups(a, b)
    with pytest.raises(ValueError, match="region count differs"):
        read_groups(a, local_rows([region(R0), region(R0 + (1 << 20))]))
    with pytest.raises(ValueError, match="2 local block ids but 1 remote"):
        pull_indices(read_groups(a, a), [0, 1], [0])


def test_indices_beyond_int32_are_refused():
    with pytest.raises(ValueError, match="exceed NIXL's int32 indices"):
        local_rows([region(L0, 2**30, 1), region(L0 + 2**30, 2**30, 1)])
