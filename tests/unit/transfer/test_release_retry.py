"""release_retry: which ids of a release the source has not acted on, and when to send them again."""

from __future__ import annotations

import pytest

from pdfleet.connector.transfer.release_retry import ReleaseDecision, ReleaseRetry, release_retry, unconfirmed

POLICY = ReleaseRetry(budget_seconds=10.0, first_delay=0.1, max_delay=1.0, max_sends=6)


@pytest.mark.parametrize("answered, remaining, gone, expected", [
    (False, (), (), ("a", "b", "c")),  # no answer: none is known to have arrived
    (True, (), ("a", "b", "c"), ()),  # all released (or ended otherwise)
    (True, (), ("a",), ("b", "c")),  # b and c not held yet
    (True, ("b",), ("a",), ("c",)),  # b held and kept (another reader's): our release will not change that
    (True, ("a", "b", "c"), (), ()),
    (False, ("a",), ("b",), ("a", "b", "c")),  # without an answer its fields mean nothing
])
def test_unconfirmed(answered, remaining, gone, expected):
    assert unconfirmed(("a", "b", "c"), answered=answered, remaining=remaining, gone=gone) == expected


@pytest.mark.parametrize("ids, now, first_sent, sends, expected", [
    ((), 0.5, 0.0, 1, ReleaseDecision()),  # nothing left: done
    (("a",), 0.5, 0.0, 1, ReleaseDecision(("a",), delay=0.1)),
    (("a",), 0.5, 0.0, 2, ReleaseDecision(("a",), delay=0.2)),
    (("a",), 0.5, 0.0, 4, ReleaseDecision(("a",), delay=0.8)),
    (("a",), 0.5, 0.0, 5, ReleaseDecision(("a",), delay=1.0)),  # capped at max_delay
    (("a",), 0.5, 0.0, 6, ReleaseDecision(why="not confirmed after 6 sends")),
    (("a",), 9.85, 0.0, 2, ReleaseDecision(why="not confirmed within 10s")),  # 9.85 + 0.2 > the budget
    (("a",), 9.85, 0.0, 1, ReleaseDecision(("a",), delay=0.1)),  # 9.95: still within it
])
def test_release_retry(ids, now, first_sent, sends, expected):
    assert release_retry(POLICY, ids, now=now, first_sent=first_sent, sends=sends) == expected


@pytest.mark.parametrize("kwargs, field", [
    ({"budget_seconds": -1}, "budget_seconds"),
    ({"first_delay": "x"}, "first_delay"),
    ({"first_delay": 2.0, "max_delay": 1.0}, "first_delay"),
    ({"max_sends": 0}, "max_sends"),
    ({"max_sends": True}, "max_sends"),
])
def test_policy_refuses_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ReleaseRetry(**kwargs)
