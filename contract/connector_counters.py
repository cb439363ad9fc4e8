"""The connector's counters: each declared once, typed, with the Prometheus name it is exported as.

Each side counts into its own dataclass: decode's sink (``SinkCounters``), prefill's source
(``SourceCounters``), the adapter's worker (``AdapterCounters``); counters both sides keep are
declared once in a base both inherit. A field made with ``counter(name, help)`` is exported as
``METRIC_PREFIX + name + "_total"`` (the ``vllm:`` prefix keeps them in vLLM's own namespace: vLLM
unregisters collectors named ``vllm:*`` when it builds its loggers again; docs/observability.md lists
the names they replaced); a plain ``float = 0.0`` field is counted but not exported (time breakdowns,
gauges). A worker reports the sum of its parts' ``asdict`` by field name (the stats key).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

__all__ = ["METRIC_PREFIX", "LAYOUT_KEY", "counter", "SideChannelCounters", "PullFailureCounters",
           "SinkCounters", "SourceCounters", "AdapterCounters", "COUNTERS", "exported_name"]

METRIC_PREFIX = "vllm:pdfleet_connector_"
# Pulls per physical KV cache layout travel as "transfers_layout_<LAYOUT>" stats keys and are
# exported as one counter, METRIC_PREFIX + "pulls_by_layout", with a bounded `layout` label.
LAYOUT_KEY = "transfers_layout_"

_METRIC = "metric"
_HELP = "help"


def counter(name: str, help_text: str) -> float:
    """A counter field exported as ``METRIC_PREFIX + name`` (``_total``) with ``help_text``."""
    return field(default=0.0, metadata={_METRIC: name, _HELP: help_text})


@dataclass
class SideChannelCounters:
    """Counted on both sides of the side channel."""

    handshakes: float = counter("handshakes", "Side-channel handshakes completed (decode) or served (prefill)")
    heartbeats: float = 0.0  # lease heartbeats sent (decode) or answered (prefill)
    messages_rejected: float = counter("messages_rejected", "Malformed or unauthenticated side-channel messages dropped")


@dataclass
class PullFailureCounters:
    """Counted by decode's sink and by the adapter (a pull refused before it reached the sink)."""

    failures: float = counter("pull_failures", "KV pulls that failed (the request was recomputed, or failed under "
                              "kv_load_failure_policy=fail)")


@dataclass
class SinkCounters(PullFailureCounters, SideChannelCounters):
    """Decode side (transfer/sink.py, peers.py, reads.py, lease_notices.py)."""

    bytes: float = counter("pull_bytes", "KV bytes pulled by decode")
    transfers: float = counter("pulls", "KV pulls completed")
    transfer_seconds: float = counter("pull_seconds",
                                      "Seconds from posting a pull's NIXL reads to their completion, summed")
    # time in the sink's _post per step: descriptors or indices built, NIXL request created
    # (make_prepped_xfer, or get_xfer_descs + initialize_xfer), posted (transfer)
    post_seconds: float = counter("pull_post_seconds", "Seconds spent building and posting NIXL reads, summed")
    post_desc_seconds: float = 0.0
    post_create_seconds: float = 0.0
    post_submit_seconds: float = 0.0
    prepped_transfers: float = 0.0  # transfers posted from prepared lists
    prep_seconds: float = 0.0  # preparing a peer's descriptor lists (at handshake)
    descriptors: float = counter("pull_descriptors", "NIXL descriptors posted")
    handshake_seconds: float = 0.0
    handshake_failures: float = counter("handshake_failures",
                                        "Handshakes that failed on decode's side (timeout, refusal, bad reply)")
    expired_leases: float = counter("pull_lease_expired", "Pulls that failed because prefill's lease had expired "
                                    "(decode side; also in pull_failures)")
    stale_agents_dropped: float = counter("stale_agents_dropped", "Cached NIXL peers dropped because the prefill "
                                          "instance changed or a read failed")
    ack_wait_seconds: float = counter("pull_ack_wait_seconds",
                                      "Seconds pulls waited, after their READ was done, for the lease ack, summed")
    releases: float = counter("releases_sent", "Release notices sent to prefill (decode side)")
    release_retries: float = counter("release_retries", "Release notices sent again because prefill did not hold "
                                     "those requests yet (its hold comes at its next step) or did not answer "
                                     "(decode side)")
    releases_unconfirmed: float = counter("releases_unconfirmed", "Release notices given up on before prefill "
                                          "confirmed them: those leases run their course (decode side)")
    heartbeat_retries: float = counter("pull_heartbeat_retries", "Unanswered lease heartbeats retried because the "
                                       "lease still had time (decode side)")
    reads_timed_out: float = counter("pull_reads_cancelled", "Pulls whose READ did not complete within its bound "
                                     "(bytes at the floor bandwidth): cancelled, recomputed, lease released "
                                     "(decode side; also in pull_failures)")
    in_flight: float = 0.0  # gauge: pulls under way
    peers: float = 0.0  # gauge: cached NIXL peers


@dataclass
class SourceCounters(SideChannelCounters):
    """Prefill side (transfer/source.py, leases.py, the side-channel server)."""

    handshakes_rejected: float = counter("handshakes_rejected",
                                         "Handshakes refused by prefill (compat hash or layout mismatch)")
    leases_held: float = counter("leases_held", "Leases started: finished prefills whose blocks are held for a "
                                 "decode (prefill side)")
    leases_completed: float = counter("leases_completed", "Leases ended by every reader's completion notification "
                                      "(prefill side)")
    leases_expired: float = counter("leases_expired", "Leases that expired before decode reported completion "
                                    "(prefill side)")
    leases_released: float = counter("leases_released", "Leases ended early by decode's release notice: aborted "
                                     "before the pull, or nothing to pull (prefill side)")
    leases_released_unread: float = counter("leases_released_unread", "Leases ended at the router's request because "
                                            "no decode will read them (decode refused or was not reached, or the "
                                            "client left), before any reader claimed them (prefill side)")
    unread_releases_refused: float = counter("unread_releases_refused", "Router release requests not acted on "
                                             "because a reader had claimed the lease (it may be reading: the lease "
                                             "runs its course) (prefill side)")
    lease_actions_refused: float = counter("lease_actions_refused", "Lease extensions, releases and completions "
                                           "refused because they came from a reader the lease was not handed to "
                                           "(prefill side)")
    lease_proof_refused: float = counter("lease_proof_refused", "Lease heartbeats, releases and completion "
                                         "notifications refused because they named a held lease without its lease "
                                         "id, params 1.4 (prefill side)")
    spent_lease_refused: float = counter("spent_lease_refused", "Lease heartbeats and completion notifications "
                                         "naming a lease id already spent (completed, released or expired): a "
                                         "replay of old params, or a reader whose lease ended (prefill side)")
    leases_active: float = 0.0  # gauge: leases held now
    notifs_rejected: float = counter("notifications_rejected", "Malformed completion notifications dropped")
    messages_served: float = 0.0
    messages_unsigned: float = counter("messages_unsigned", "Side-channel messages dropped because they carried no "
                                       "signature (prefill side)")
    messages_bad_signature: float = counter("messages_bad_signature", "Side-channel messages dropped for a wrong "
                                            "signature or a key not accepted (prefill side)")
    messages_replayed: float = counter("messages_replayed", "Side-channel messages dropped as replays: nonce seen or "
                                       "timestamp outside the window")
    messages_too_deep: float = counter("messages_too_deep", "Side-channel messages dropped for nesting deeper than "
                                       "the decoder allows (prefill side)")
    messages_malformed: float = 0.0
    messages_oversized: float = 0.0
    side_channel_loop_errors: float = 0.0
    side_channel_restarts: float = counter("side_channel_restarts",
                                           "Times prefill's side-channel serving loop failed and was started again")


@dataclass
class AdapterCounters(PullFailureCounters):
    """The adapter's worker (failures: pulls refused before reaching the sink)."""

    params_rejected: float = counter("params_rejected",
                                     "Requests whose kv_transfer_params were invalid (computed locally instead)")
    blocks_corrupted_for_test: float = counter("test_blocks_corrupted",
                                               "Pulled blocks overwritten by the test-only fault hook")


def _exported(*classes: type) -> dict[str, tuple[str, str]]:
    out: dict[str, tuple[str, str]] = {}
    for cls in classes:
        for f in fields(cls):
            if _METRIC in f.metadata:
                out.setdefault(f.name, (f.metadata[_METRIC], f.metadata[_HELP]))
    return out


# Stats key (a counters field) -> (exported name without prefix and _total, help text).
COUNTERS: dict[str, tuple[str, str]] = _exported(SinkCounters, SourceCounters, AdapterCounters)


def exported_name(key: str) -> str:
    """The Prometheus counter name a stats key is exported as (without the ``_total`` suffix)."""
    return METRIC_PREFIX + COUNTERS[key][0]

