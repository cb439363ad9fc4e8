"""reply_judged_at: a reply read late is judged against when it could first have been read (pure)."""

from __future__ import annotations

import math

import pytest

from pdfleet.connector.transfer.auth import DEFAULT_REPLAY_WINDOW, ReplayGuard
from pdfleet.connector.transfer.sidechannel import reply_judged_at


@pytest.mark.parametrize(
    "signed_at, asked_at, now, judged",
    [
        (1000.0, 999.9, 1000.1, 1000.0),  # read at once: judged when signed
        (1000.0, 999.9, 1098.2, 1000.0),  # read 98 s late (a blocked poller): still when signed
        (990.0, 999.9, 1000.1, 999.9),  # signed before we asked: judged from our request
        (1005.0, 999.9, 1000.1, 1000.1),  # from the future (clock skew): judged now
        (1000.0, None, 1098.2, 1098.2),  # nobody waits on this peer: plain now
    ],
)
def test_reply_judged_at_table(signed_at, asked_at, now, judged):
    assert reply_judged_at(signed_at, asked_at, now) == judged


def test_a_late_read_reply_passes_the_window_and_an_old_one_does_not():
    window = DEFAULT_REPLAY_WINDOW
    asked, signed, read = 1000.0, 1000.05, 1098.2  # read 98 s after it was signed
    guard = ReplayGuard(window)
    guard.check(signed, b"n" * 16, reply_judged_at(signed, asked, read))  # accepted
    # Negative control: judged against the late clock, the same reply is dropped as stale.
    with pytest.raises(ValueError, match="away from now"):
        ReplayGuard(window).check(signed, b"n" * 16, read)
    # A reply signed a whole window before the request it would answer is still refused.
    with pytest.raises(ValueError, match="away from now"):
        ReplayGuard(window).check(asked - window - 1, b"m" * 16, reply_judged_at(asked - window - 1, asked, read))


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_non_finite_timestamps_never_pass(bad):
    with pytest.raises(ValueError):
        ReplayGuard().check(bad, b"x" * 16, reply_judged_at(bad, 1000.0, 1001.0))
