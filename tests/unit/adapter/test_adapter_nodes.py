"""One side-channel host per node of a multi-node prefill (pure)."""

from __future__ import annotations

import pytest

from pdfleet.connector.adapter.config import ConfigError
from pdfleet.connector.adapter.nodes import LWS_LEADER_ADDRESS_ENV, NODE_HOSTS_ENV, host_for_rank, node_hosts

LEADER = "fleet-prefill-r1-0.fleet-prefill-r1.team-a"


@pytest.mark.parametrize("env, nnodes, want", [
    ({}, 1, ()),
    ({LWS_LEADER_ADDRESS_ENV: LEADER}, 1, ()),  # one node: remote_host says it all
    ({}, 2, ()),  # no way to know: every rank at the leader, as before
    ({LWS_LEADER_ADDRESS_ENV: LEADER}, 2, ("10.1.0.5", "fleet-prefill-r1-0-1.fleet-prefill-r1.team-a")),
    ({LWS_LEADER_ADDRESS_ENV: LEADER}, 3, ("10.1.0.5", "fleet-prefill-r1-0-1.fleet-prefill-r1.team-a",
                                           "fleet-prefill-r1-0-2.fleet-prefill-r1.team-a")),
    ({NODE_HOSTS_ENV: "10.1.0.5, 10.1.0.9", LWS_LEADER_ADDRESS_ENV: LEADER}, 2, ("10.1.0.5", "10.1.0.9")),
])
def test_node_hosts_table(env, nnodes, want):
    assert node_hosts(env, nnodes, "10.1.0.5") == want


@pytest.mark.parametrize("env, nnodes, needle", [
    ({NODE_HOSTS_ENV: "10.1.0.5"}, 2, NODE_HOSTS_ENV),
    ({NODE_HOSTS_ENV: "10.1.0.5,,10.1.0.6"}, 3, NODE_HOSTS_ENV),
    ({LWS_LEADER_ADDRESS_ENV: "no-domain"}, 2, LWS_LEADER_ADDRESS_ENV),
])
def test_bad_node_hosts_name_the_variable(env, nnodes, needle):
    with pytest.raises(ConfigError, match=needle):
        node_hosts(env, nnodes, "10.1.0.5")


@pytest.mark.parametrize("hosts, tp, want", [
    (("a",), 4, ["a"] * 4),
    (("a", "b"), 2, ["a", "b"]),
    (("a", "b"), 8, ["a"] * 4 + ["b"] * 4),
    (("a", "b", "c", "d"), 8, ["a", "a", "b", "b", "c", "c", "d", "d"]),
])
def test_host_for_rank_table(hosts, tp, want):
    assert [host_for_rank(hosts, r, tp) for r in range(tp)] == want
