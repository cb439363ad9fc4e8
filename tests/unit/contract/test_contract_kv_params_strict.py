"""kv_transfer_params, read strictly for decode: every key decode acts on is checked, and a refusal
names the field (pdfleet.contract.kv_params: ``parse_remote_prefill``; pure, no vLLM engine)."""

from __future__ import annotations

import pytest
from kv_params_cases import BS, MONO, NOW, OLD, good

from pdfleet.connector.adapter.nodes import host_for_rank
from pdfleet.contract.kv_params import InvalidTransferParams, num_tokens_to_pull, parse_remote_prefill, produce


def parse(params, n=80, tp=1):
    return parse_remote_prefill(params, num_prompt_tokens=n, block_size=BS, local_tp_size=tp, now=NOW,
                                accepted_at=MONO)


def test_round_trip_of_producer_params():
    r = parse(good())
    assert r.remote_block_ids == (4, 5, 6)
    assert (r.remote_host, r.remote_port, r.remote_engine_id, r.remote_request_id) == ("10.0.0.7", 5600, "prefill-0", "cmpl-1")
    assert r.remote_instance_id == "abc" and r.remote_lease_seconds == 30.0 and r.lease_deadline == MONO + 30
    assert r.remote_lease_expiry is None


def test_1_2_params_keep_their_wall_clock_expiry():
    r = parse({**good(), **OLD, "remote_lease_expiry": NOW + 30})
    assert r.remote_lease_expiry == NOW + 30 and r.lease_deadline is None and r.remote_lease_seconds is None


def test_a_1_3_lease_needs_no_time_of_acceptance_to_be_valid():
    r = parse_remote_prefill(good(), num_prompt_tokens=80, block_size=BS, local_tp_size=1, now=NOW)
    assert r.remote_lease_seconds == 30.0 and r.lease_deadline is None


def test_remote_hosts_round_trip_and_name_each_ranks_host():
    p = produce(block_ids=[4, 5, 6], engine_id="prefill-0", request_id="cmpl-1", host="10.0.0.7", port=5600,
                tp_size=4, instance_id=None, lease_seconds=30, num_tokens=80,
                hosts=("10.0.0.7", "pf-0-1.pf.ns"))
    r = parse(p, tp=4)
    assert r.hosts == ("10.0.0.7", "pf-0-1.pf.ns")
    assert [host_for_rank(r.hosts, rank, r.tp_size) for rank in range(4)] == ["10.0.0.7"] * 2 + ["pf-0-1.pf.ns"] * 2
    one = parse(good())  # a single-node prefill: no remote_hosts, every rank at remote_host
    assert "remote_hosts" not in good() and one.hosts == ("10.0.0.7",)


def test_flat_block_list_is_accepted():
    assert parse(good(remote_block_ids=[1, 2])).remote_block_ids == (1, 2)


@pytest.mark.parametrize(
    "override, field",
    [
        ({"do_remote_prefill": "yes"}, "do_remote_prefill"),
        ({"do_remote_decode": True}, "do_remote_decode"),
        ({"remote_block_ids": None}, "remote_block_ids"),
        ({"remote_block_ids": "1,2"}, "remote_block_ids"),
        ({"remote_block_ids": [[1, 2], [3]]}, "remote_block_ids"),
        ({"remote_block_ids": [[1]]}, "remote_block_ids"),  # too short: 80 tokens need 2 full blocks
        ({"remote_block_ids": [list(range(10))]}, "remote_block_ids"),  # too long
        ({"remote_block_ids": [[1, -2, 3]]}, "remote_block_ids[1]"),
        ({"remote_block_ids": [[1, 2**40, 3]]}, "remote_block_ids[1]"),
        ({"remote_block_ids": [[1, "2", 3]]}, "remote_block_ids[1]"),
        ({"remote_block_ids": [[1, True, 3]]}, "remote_block_ids[1]"),
        ({"remote_block_ids": [[1, 1, 3]]}, "remote_block_ids"),
        ({"remote_engine_id": ""}, "remote_engine_id"),
        ({"remote_engine_id": 7}, "remote_engine_id"),
        ({"remote_request_id": None}, "remote_request_id"),
        ({"remote_host": "0.0.0.0"}, "remote_host"),
        ({"remote_host": "bad host!"}, "remote_host"),
        ({"remote_host": ["10.0.0.1"]}, "remote_host"),
        ({"remote_port": 0}, "remote_port"),
        ({"remote_port": 70000}, "remote_port"),
        ({"remote_port": "5600"}, "remote_port"),
        ({"tp_size": 3}, "tp_size"),  # does not divide decode TP 2 (see below)
        ({"tp_size": 0}, "tp_size"),
        ({"remote_instance_id": "a,b"}, "remote_instance_id"),
        ({**OLD, "remote_lease_expiry": NOW - 1}, "remote_lease_expiry"),
        ({**OLD, "remote_lease_expiry": "soon"}, "remote_lease_expiry"),
        ({**OLD, "remote_lease_expiry": NOW + 3601}, "remote_lease_expiry"),
        ({"remote_lease_seconds": -1.0}, "remote_lease_seconds"),
        ({"remote_lease_seconds": 0}, "remote_lease_seconds"),
        ({"remote_lease_seconds": float("nan")}, "remote_lease_seconds"),
        ({"remote_lease_seconds": float("inf")}, "remote_lease_seconds"),
        ({"remote_lease_seconds": True}, "remote_lease_seconds"),
        ({"remote_lease_seconds": "30"}, "remote_lease_seconds"),
        ({"remote_lease_seconds": 3600.5}, "remote_lease_seconds"),
        ({"remote_lease_seconds": 1e308}, "remote_lease_seconds"),
        ({"remote_num_tokens": 10}, "remote_num_tokens"),
        ({"remote_hosts": "10.0.0.7"}, "remote_hosts"),
        ({"remote_hosts": []}, "remote_hosts"),
        ({"remote_hosts": ["a", "b", "c"]}, "remote_hosts"),  # 3 nodes cannot hold tp_size 2 evenly
        ({"remote_hosts": ["10.0.0.7", "0.0.0.0"]}, "remote_hosts[1]"),
        ({"remote_hosts": ["10.0.0.7", 7]}, "remote_hosts[1]"),
        ({"remote_hosts": ["bad host!"]}, "remote_hosts[0]"),
    ],
)
def test_bad_params_name_the_field(override, field):
    with pytest.raises(InvalidTransferParams) as exc:
        parse(good(**override, **({"tp_size": 2} if "remote_hosts" in override else {})), tp=2)
    assert exc.value.field == field
    assert str(exc.value).startswith(f"kv_transfer_params.{field}:")


@pytest.mark.parametrize("override", [
    {"remote_lease_expiry": NOW - 1},  # 1.3: an instant is not read, so a stale one refuses nothing
    {"remote_lease_expiry": "soon"},
    {"remote_lease_seconds": None},  # optional: then only the acks bound the pull
], ids=["1.3 ignores an expiry", "1.3 ignores a bad expiry", "1.3 without seconds"])
def test_1_3_params_read_no_wall_clock(override):
    assert parse(good(**override)).remote_lease_expiry is None


def test_the_refusals_of_a_lease_say_what_is_allowed():
    with pytest.raises(InvalidTransferParams, match=r"remote_lease_seconds: must be a number of seconds in \(0, 3600\]"):
        parse(good(remote_lease_seconds=-1))


def test_missing_keys_are_named():
    for key in ("remote_engine_id", "remote_request_id", "remote_host", "remote_port", "remote_block_ids"):
        p = good()
        del p[key]
        with pytest.raises(InvalidTransferParams) as exc:
            parse(p)
        assert exc.value.field == key


def test_root_must_be_an_object():
    with pytest.raises(InvalidTransferParams):
        parse(["do_remote_prefill"])


def test_heterogeneous_tp_accepts_multiples():
    assert parse(good(tp_size=1), tp=2).tp_size == 1
    assert parse(good(tp_size=2, remote_instance_id="a,b"), tp=4).tp_size == 2


@pytest.mark.parametrize("n, pulled", [(0, 0), (1, 0), (31, 0), (32, 32), (33, 32), (64, 64), (95, 64)])
def test_full_blocks_only(n, pulled):
    assert num_tokens_to_pull(n, BS) == pulled


def test_short_prompt_needs_no_blocks():
    assert parse(good(remote_block_ids=[[3]]), n=20).remote_block_ids == (3,)


# -- single-use leases (params 1.4, issue 30) ---------------------------------------------------------
def test_1_4_params_carry_the_lease_id_decode_names():
    from pdfleet.contract import kv_params as K

    lease_id = bytes(range(16))
    p = produce(block_ids=[4, 5, 6], engine_id="prefill-0", request_id="cmpl-1", host="10.0.0.7", port=5600,
                tp_size=1, instance_id="abc", lease_seconds=30, num_tokens=80, lease_id=lease_id)
    assert p["pdfleet_params_version"] == "1.4" and p["remote_lease_id"] == lease_id.hex()
    assert parse(p).remote_lease_id == lease_id
    # a fresh random one per call when none is given (what the scheduler does for each hold)
    assert K.lease_id_of(good()) != K.lease_id_of(good()) and len(K.lease_id_of(good())) == 16


@pytest.mark.parametrize("value", [None, "", "00" * 15, "00" * 17, "AB" * 16, "zz" * 16, 5, ["00" * 16], b"\0" * 16])
def test_a_1_4_lease_id_is_required_and_checked(value):
    p = good()
    if value is None:
        del p["remote_lease_id"]
    else:
        p["remote_lease_id"] = value
    with pytest.raises(InvalidTransferParams) as exc:
        parse(p)
    assert exc.value.field == "remote_lease_id" and "32 lowercase hex characters" in str(exc.value)
    # negative control: the same params with a good id pass
    assert parse({**p, "remote_lease_id": "ab" * 16}).remote_lease_id == bytes([0xAB]) * 16

