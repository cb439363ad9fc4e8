"""The decision core gives byte-identical decisions on a recorded replay (decision_replay.py): both
prefill policies, Always and Conditional, the canary split, retries, ejections and load."""

from __future__ import annotations

import json

from decision_replay import RECORDING, encoded, replay


def _diff(a: dict, b: dict) -> list[str]:
    out = []
    for key in sorted(set(a) | set(b)):
        for i, (x, y) in enumerate(zip(a.get(key, []), b.get(key, []))):
            if x != y:
                out.append(f"{key} request {i}: recorded {x}, now {y}")
    return out


def test_decisions_match_the_recording_byte_for_byte() -> None:
    now = replay()
    recorded = json.loads(RECORDING.read_bytes())
    assert not _diff(recorded, now)[:5]
    assert encoded(now) == RECORDING.read_bytes()


def test_the_replay_sees_a_changed_rule() -> None:
    """Negative control: the load bound of prefix-aware picking changed from 4 to 0 changes decisions, so
    a picker that scored or bounded differently would not pass the test above."""
    changed = replay(max_imbalance=0)
    assert encoded(changed) != RECORDING.read_bytes()
    assert any(k.startswith("prefixAware") for k in {d.split(" request")[0] for d in _diff(json.loads(
        RECORDING.read_bytes()), changed)})
