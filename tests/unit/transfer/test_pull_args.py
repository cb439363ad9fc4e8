"""A pull's arguments checked before anything is sent, and where its source rank listens (table tests)."""

from __future__ import annotations

import pytest

from pdfleet.connector.transfer.layout import InvalidBlockIds, KVLayout
from pdfleet.connector.transfer.pull_args import check_pull_args, readers_per_rank, source_port

LAYOUT = KVLayout(block_size=32, dtype="float16", layout="NHD", num_kv_heads=2, head_dim=64, tp_rank=1, tp_size=2)
GOOD = dict(request_id="r1", host="10.0.0.1", port=5600, remote_engine_id="p0", remote_instance_id="i0",
            remote_block_ids=[1, 2], local_block_ids=[3, 4], remote_tp_size=None, remote_lease_expiry=None,
            remote_lease_deadline=None, lease_id=None)


def test_a_good_pull_reads_from_the_source_rank_of_its_own_rank():
    assert check_pull_args(LAYOUT, 16, **GOOD) == (("10.0.0.1", 5601), [1, 2], [3, 4])
    assert check_pull_args(LAYOUT, 16, **{**GOOD, "remote_tp_size": 1})[0] == ("10.0.0.1", 5600)  # 2 readers, 1 rank


@pytest.mark.parametrize("field, value, message", [
    ("request_id", "", "request_id must be a non-empty string"),
    ("host", None, "host must be a non-empty string"),
    ("port", 0, "port must be an int in 1..65535"),
    ("port", True, "port must be an int in 1..65535"),
    ("port", 65535, "out of range"),  # + its rank 1
    ("remote_engine_id", "", "remote_engine_id must be a non-empty string"),
    ("remote_instance_id", 7, "remote_instance_id must be a string or None"),
    ("remote_lease_expiry", float("nan"), "remote_lease_expiry must be a unix time or None"),
    ("remote_lease_expiry", True, "remote_lease_expiry must be a unix time or None"),
    ("remote_lease_deadline", float("inf"), "remote_lease_deadline must be a monotonic time or None"),
    ("lease_id", b"short", "lease_id must be"),
])
def test_a_bad_argument_is_named(field, value, message):
    with pytest.raises(ValueError, match=message):
        check_pull_args(LAYOUT, 16, **{**GOOD, field: value})


def test_block_ids_beyond_the_local_cache_are_refused():
    with pytest.raises(InvalidBlockIds):
        check_pull_args(LAYOUT, 4, **GOOD)  # local block 4 of 4


@pytest.mark.parametrize("remote_tp, readers", [(None, 1), (2, 1), (1, 2), (0, 1), ("2", 1)])
def test_readers_per_source_rank(remote_tp, readers):
    assert readers_per_rank(LAYOUT, remote_tp) == readers


def test_source_port_adds_the_rank_and_refuses_past_65535():
    assert source_port(LAYOUT, 5600, None) == 5601
    with pytest.raises(ValueError, match="port must be an int in 1..65535"):
        source_port(LAYOUT, 65535, None)
