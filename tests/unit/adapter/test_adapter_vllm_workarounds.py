"""The bound on vLLM's lost shared-memory wake-ups: parsing the setting, and applying it to vLLM's real module."""

from __future__ import annotations

import pytest

from pdfleet.connector.adapter.vllm_workarounds import SHM_RECHECK_ENV, apply_shm_recheck, shm_recheck_ms


@pytest.mark.parametrize("value, ms", [
    ("50", 50), (" 20 ", 20), ("1", 1), ("5000", 5000),
    (None, None), ("", None), ("0", None), ("5001", None), ("-5", None), ("1.5", None), ("fast", None),
])
def test_shm_recheck_ms_table(value, ms):
    assert shm_recheck_ms(value) == ms


@pytest.fixture
def shm_broadcast(monkeypatch):
    from vllm.distributed.device_communicators import shm_broadcast

    monkeypatch.setattr(shm_broadcast, "SHM_READER_RECHECK_INTERVAL_MS", 5000)  # restored after the test
    return shm_broadcast


def test_lowers_vllms_recheck_interval(shm_broadcast):
    assert apply_shm_recheck({SHM_RECHECK_ENV: "50"}) == 50
    assert shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS == 50
    # The reader's wait reads it on every call: a parked reader now wakes within 50 ms.
    timeout = shm_broadcast.MessageQueue.ReadTimeoutWithWarnings(timeout=None, should_warn=False)
    assert timeout.timeout_ms() == 50


def test_never_raises_it_and_leaves_vllm_alone_when_unset_or_bad(shm_broadcast, caplog):
    assert apply_shm_recheck({}) is None
    assert apply_shm_recheck({SHM_RECHECK_ENV: "soon"}) is None
    assert SHM_RECHECK_ENV in caplog.text and "1..5000" in caplog.text
    assert shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS == 5000
    shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = 20
    assert apply_shm_recheck({SHM_RECHECK_ENV: "50"}) == 20
    assert shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS == 20
