"""Where each node of a multi-node prefill engine listens for its ranks' side channels (pure).

A prefill engine spread over N pods (nodesPerReplica > 1) runs TP ranks
``[n * tp / N, (n + 1) * tp / N)`` on node n (vLLM's multiprocessing launcher
numbers ranks node by node), and each rank's side channel listens on its own
pod. The scheduler (on the leader) advertises one host per node in
``kv_transfer_params.remote_hosts`` so that a decode rank dials the pod holding
the prefill rank it reads. The hosts are:

- ``PDFLEET_KV_NODE_HOSTS`` (comma-separated, one per node) when set;
- else, in a LeaderWorkerSet, the pods' stable DNS names: node 0 is this pod
  (its side-channel host), node n >= 1 is the worker pod ``<leader>-<n>``
  under the leader's subdomain, from ``LWS_LEADER_ADDRESS``
  (``<lws>-<group>.<subdomain>.<namespace>``);
- else none: every rank is dialled at the leader, which only works with one node.
"""

from __future__ import annotations

from collections.abc import Mapping

from pdfleet.connector.adapter.config import ConfigError

NODE_HOSTS_ENV = "PDFLEET_KV_NODE_HOSTS"
LWS_LEADER_ADDRESS_ENV = "LWS_LEADER_ADDRESS"


def node_hosts(env: Mapping[str, str], nnodes: int, own_host: str) -> tuple[str, ...]:
    """One side-channel host per node of this engine, or () for a single node (or unknown)."""
    if nnodes <= 1:
        return ()
    explicit = env.get(NODE_HOSTS_ENV, "").strip()
    if explicit:
        hosts = tuple(h.strip() for h in explicit.split(","))
        if len(hosts) != nnodes or not all(hosts):
            raise ConfigError(f"{NODE_HOSTS_ENV}={explicit!r}: needs {nnodes} non-empty hosts, one per node")
        return hosts
    leader = env.get(LWS_LEADER_ADDRESS_ENV, "").strip()
    if not leader:
        return ()
    pod, _, domain = leader.partition(".")
    if not pod or not domain:
        raise ConfigError(f"{LWS_LEADER_ADDRESS_ENV}={leader!r}: expected <leader pod>.<subdomain>.<namespace>")
    return (own_host, *(f"{pod}-{n}.{domain}" for n in range(1, nnodes)))


def host_for_rank(hosts: tuple[str, ...], rank: int, tp_size: int) -> str:
    """The host of source rank ``rank`` of a ``tp_size``-rank engine spread evenly over ``hosts``."""
    return hosts[rank * len(hosts) // tp_size]


__all__ = ["node_hosts", "host_for_rank", "NODE_HOSTS_ENV", "LWS_LEADER_ADDRESS_ENV"]
