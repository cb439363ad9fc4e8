"""heartbeat_retry: when an unanswered lease heartbeat is retried, and when the pull gives up (pure)."""

from __future__ import annotations

import pytest

from pdfleet.connector.transfer.retry import HeartbeatRetry, heartbeat_retry

P = HeartbeatRetry(budget_seconds=8.0, first_delay=0.05, max_delay=1.0, margin_seconds=0.25)


@pytest.mark.parametrize(
    "now, deadline, failing_since, retries, retry, delay, why",
    [
        # time left, inside the budget: retry, backing off 0.05, 0.1, 0.2 ... capped at 1 s
        (10.0, 30.0, 10.0, 0, True, 0.05, ""),
        (10.0, 30.0, 9.0, 1, True, 0.1, ""),
        (10.0, 30.0, 9.0, 3, True, 0.4, ""),
        (10.0, 30.0, 9.0, 10, True, 1.0, ""),
        # never past the deadline (less its margin)
        (10.0, 10.6, 9.0, 10, True, 0.35, ""),
        # no deadline known: nothing to wait on
        (10.0, None, 10.0, 0, False, 0.0, "no lease deadline"),
        # the lease ends (within the margin, or already over)
        (10.0, 10.25, 9.0, 0, False, 0.0, "the lease ends in 0.25s"),
        (10.0, 9.0, 9.0, 0, False, 0.0, "the lease ends in 0.00s"),
        # the per-pull budget is used up, although the lease has time
        (18.0, 100.0, 10.0, 5, False, 0.0, "unanswered for 8.0s"),
        (17.9, 100.0, 10.0, 5, True, 1.0, ""),
    ],
)
def test_heartbeat_retry_table(now, deadline, failing_since, retries, retry, delay, why):
    d = heartbeat_retry(P, now=now, deadline=deadline, failing_since=failing_since, retries=retries)
    assert d.retry is retry
    assert d.delay == pytest.approx(delay)
    assert why in d.why and (d.why == "") is retry


def test_zero_budget_never_retries():
    d = heartbeat_retry(HeartbeatRetry(budget_seconds=0), now=1.0, deadline=100.0, failing_since=1.0, retries=0)
    assert not d.retry and "budget 0s" in d.why


@pytest.mark.parametrize("field, value", [("budget_seconds", -1), ("first_delay", float("nan")),
                                          ("max_delay", "1"), ("margin_seconds", True)])
def test_bad_policy_values_name_the_field(field, value):
    with pytest.raises(ValueError, match=f"HeartbeatRetry.{field}"):
        HeartbeatRetry(**{field: value})


def test_first_delay_above_max_is_refused():
    with pytest.raises(ValueError, match="first_delay must not exceed max_delay"):
        HeartbeatRetry(first_delay=2.0, max_delay=1.0)
