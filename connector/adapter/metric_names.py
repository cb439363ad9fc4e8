"""The connector's counters: stats key -> exported Prometheus name and help (no vLLM import,
so tools and tests can read the names without loading vLLM)."""

from __future__ import annotations

# Stats key (the transfer core's and the adapter's counter names, unchanged) -> (exported
# name, help text). Exported as ``vllm:pdfleet_connector_<name>_total``: the ``vllm:`` prefix
# keeps them in vLLM's own namespace (vLLM unregisters collectors named ``vllm:*`` when it
# builds its loggers again), and docs/observability.md lists the names they replaced.
COUNTERS: dict[str, tuple[str, str]] = {
    "bytes": ("pull_bytes", "KV bytes pulled by decode"),
    "transfers": ("pulls", "KV pulls completed"),
    "transfer_seconds": ("pull_seconds", "Seconds from posting a pull's NIXL reads to their completion, summed"),
    "post_seconds": ("pull_post_seconds", "Seconds spent building and posting NIXL reads, summed"),
    "descriptors": ("pull_descriptors", "NIXL descriptors posted"),
    "ack_wait_seconds": ("pull_ack_wait_seconds",
                         "Seconds pulls waited, after their READ was done, for the lease ack, summed"),
    "failures": ("pull_failures",
                 "KV pulls that failed (the request was recomputed, or failed under kv_load_failure_policy=fail)"),
    "handshakes": ("handshakes", "Side-channel handshakes completed (decode) or served (prefill)"),
    "handshake_failures": ("handshake_failures",
                           "Handshakes that failed on decode's side (timeout, refusal, bad reply)"),
    "handshakes_rejected": ("handshakes_rejected", "Handshakes refused by prefill (compat hash or layout mismatch)"),
    "expired_leases": ("pull_lease_expired",
                       "Pulls that failed because prefill's lease had expired (decode side; also in pull_failures)"),
    "leases_expired": ("leases_expired", "Leases that expired before decode reported completion (prefill side)"),
    "leases_held": ("leases_held", "Leases started: finished prefills whose blocks are held for a decode (prefill side)"),
    "leases_completed": ("leases_completed", "Leases ended by every reader's completion notification (prefill side)"),
    "leases_released": ("leases_released", "Leases ended early by decode's release notice: aborted before the pull, "
                        "or nothing to pull (prefill side)"),
    "leases_released_unread": ("leases_released_unread",
                               "Leases ended at the router's request because no decode will read them (decode refused "
                               "or was not reached, or the client left), before any reader claimed them (prefill side)"),
    "unread_releases_refused": ("unread_releases_refused",
                                "Router release requests not acted on because a reader had claimed the lease "
                                "(it may be reading: the lease runs its course) (prefill side)"),
    "releases": ("releases_sent", "Release notices sent to prefill (decode side)"),
    "release_retries": ("release_retries", "Release notices sent again because prefill did not hold those requests "
                        "yet (its hold comes at its next step) or did not answer (decode side)"),
    "releases_unconfirmed": ("releases_unconfirmed", "Release notices given up on before prefill confirmed them: "
                             "those leases run their course (decode side)"),
    "stale_agents_dropped": ("stale_agents_dropped",
                             "Cached NIXL peers dropped because the prefill instance changed or a read failed"),
    "messages_rejected": ("messages_rejected", "Malformed or unauthenticated side-channel messages dropped"),
    "messages_unsigned": ("messages_unsigned",
                          "Side-channel messages dropped because they carried no signature (prefill side)"),
    "messages_bad_signature": ("messages_bad_signature",
                               "Side-channel messages dropped for a wrong signature or a key not accepted (prefill side)"),
    "messages_replayed": ("messages_replayed",
                          "Side-channel messages dropped as replays: nonce seen or timestamp outside the window"),
    "notifs_rejected": ("notifications_rejected", "Malformed completion notifications dropped"),
    "messages_too_deep": ("messages_too_deep",
                          "Side-channel messages dropped for nesting deeper than the decoder allows (prefill side)"),
    "side_channel_restarts": ("side_channel_restarts",
                              "Times prefill's side-channel serving loop failed and was started again"),
    "heartbeat_retries": ("pull_heartbeat_retries",
                          "Unanswered lease heartbeats retried because the lease still had time (decode side)"),
    "reads_timed_out": ("pull_reads_cancelled",
                        "Pulls whose READ did not complete within its bound (bytes at the floor bandwidth): "
                        "cancelled, recomputed, lease released (decode side; also in pull_failures)"),
    "lease_actions_refused": ("lease_actions_refused",
                              "Lease extensions, releases and completions refused because they came from a reader "
                              "the lease was not handed to (prefill side)"),
    "lease_proof_refused": ("lease_proof_refused",
                            "Lease heartbeats, releases and completion notifications refused because they named a "
                            "held lease without its lease id, params 1.4 (prefill side)"),
    "spent_lease_refused": ("spent_lease_refused",
                            "Lease heartbeats and completion notifications naming a lease id already spent (completed, "
                            "released or expired): a replay of old params, or a reader whose lease ended (prefill side)"),
    "params_rejected": ("params_rejected", "Requests whose kv_transfer_params were invalid (computed locally instead)"),
    "blocks_corrupted_for_test": ("test_blocks_corrupted", "Pulled blocks overwritten by the test-only fault hook"),
}
METRIC_PREFIX = "vllm:pdfleet_connector_"
# Pulls per physical KV cache layout travel as "transfers_layout_<LAYOUT>" stats keys and are
# exported as one counter, METRIC_PREFIX + "pulls_by_layout", with a bounded `layout` label.
LAYOUT_KEY = "transfers_layout_"


def exported_name(key: str) -> str:
    """The Prometheus counter name a stats key is exported as (without the ``_total`` suffix)."""
    return METRIC_PREFIX + COUNTERS[key][0]
