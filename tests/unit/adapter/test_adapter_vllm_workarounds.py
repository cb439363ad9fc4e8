"""The bound on vLLM's lost shared-memory wake-ups: parsing the setting, and applying it to vLLM's real module."""

from __future__ import annotations

import time

import pytest

from pdfleet.connector.adapter import vllm_workarounds
from pdfleet.connector.adapter.vllm_workarounds import (
    SHM_NAP_ENV, SHM_RECHECK_ENV, SHM_SPIN_ENV, apply_shm_recheck, apply_shm_spin, shm_recheck_ms, shm_spin_ms,
    shm_spin_nap_us,
)


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


@pytest.mark.parametrize("value, ms", [
    ("5", 5), ("0", 0), (" 7 ", 7), ("1000", 1000),
    (None, None), ("", None), ("1001", None), ("-1", None), ("0.5", None), ("off", None),
])
def test_shm_spin_ms_table(value, ms):
    assert shm_spin_ms(value) == ms


@pytest.fixture
def spin_condition(monkeypatch):
    from vllm.distributed.device_communicators.shm_broadcast import SpinCondition

    monkeypatch.setattr(SpinCondition, "wait", SpinCondition.wait)  # the patch is undone after the test
    for attr in ("_pdfleet_spin_cap_s", "_pdfleet_spin_nap_s"):
        if hasattr(SpinCondition, attr):
            monkeypatch.delattr(SpinCondition, attr)
    return SpinCondition


def _reader(spin_condition):
    """A real reader of vLLM's SpinCondition (a writer binds the notification address)."""
    import zmq

    ctx = zmq.Context()
    addr = f"inproc://pdfleet-spin-{id(ctx)}"
    writer = spin_condition(is_reader=False, context=ctx, notify_address=addr)
    reader = spin_condition(is_reader=True, context=ctx, notify_address=addr)
    return ctx, writer, reader


def _close(ctx, writer, reader) -> None:
    for s in (writer.local_notify_socket, reader.local_notify_socket, reader.read_cancel_socket,
              reader.write_cancel_socket):
        s.close(linger=0)
    ctx.term()


def test_caps_the_spin_of_readers_built_before_it(spin_condition):
    ctx, writer, reader = _reader(spin_condition)
    try:
        assert reader.busy_loop_s == 1  # vLLM's own: a second of sched_yield after every read
        assert apply_shm_spin({SHM_SPIN_ENV: "5"}) == 5
        reader.record_read()
        reader.wait(timeout_ms=10)  # spins (returns at once) inside the cap, parks after it
        assert reader.busy_loop_s == 0.005
        assert apply_shm_spin({SHM_SPIN_ENV: "50"}) == 5  # a second load never lengthens it
        reader.wait(timeout_ms=10)
        assert reader.busy_loop_s == 0.005
    finally:
        _close(ctx, writer, reader)


def test_spin_is_left_alone_when_unset_or_bad(spin_condition, caplog):
    original = spin_condition.wait
    assert apply_shm_spin({}) is None
    assert apply_shm_spin({SHM_SPIN_ENV: "briefly"}) is None
    assert SHM_SPIN_ENV in caplog.text and "0..1000" in caplog.text
    assert spin_condition.wait is original


@pytest.mark.parametrize("value, us", [
    ("1000", 1000), ("0", 0), (" 50 ", 50), ("10000", 10000),
    (None, None), ("", None), ("10001", None), ("-1", None), ("0.5", None), ("short", None),
])
def test_shm_spin_nap_us_table(value, us):
    assert shm_spin_nap_us(value) == us


class _Calls:
    """Records the reader's sleeps and sched_yields instead of making them."""

    def __init__(self, monkeypatch):
        from vllm.distributed.device_communicators import shm_broadcast

        self.naps: list[float] = []
        self.yields = 0
        monkeypatch.setattr(vllm_workarounds, "time", type("T", (), {
            "monotonic": staticmethod(time.monotonic), "sleep": staticmethod(self.naps.append)}))

        def counted_yield():
            self.yields += 1
        monkeypatch.setattr(shm_broadcast, "sched_yield", counted_yield)


@pytest.mark.parametrize("nap, naps, yields", [
    ("1000", [0.001], 0),  # inside the window: a sleep, not sched_yield
    ("0", [], 1),          # 0: vLLM's own sched_yield spin
    (None, [], 1),         # unset: likewise
])
def test_a_reader_inside_its_spin_window_naps_instead_of_yielding(spin_condition, monkeypatch, nap, naps, yields):
    calls = _Calls(monkeypatch)
    ctx, writer, reader = _reader(spin_condition)
    try:
        env = {SHM_SPIN_ENV: "1000"} | ({SHM_NAP_ENV: nap} if nap is not None else {})
        assert apply_shm_spin(env) == 1000
        reader.record_read()
        reader.wait(timeout_ms=10)
        assert (calls.naps, calls.yields) == (naps, yields)
        # past the window every reader parks on the notification (here: times out), nap or not
        reader.last_read -= 5
        reader.wait(timeout_ms=10)
        assert (calls.naps, calls.yields) == (naps, yields)
    finally:
        _close(ctx, writer, reader)


def test_a_nap_without_a_spin_cap_or_out_of_range_is_ignored_with_a_warning(spin_condition, caplog):
    original = spin_condition.wait
    assert apply_shm_spin({SHM_NAP_ENV: "1000"}) is None
    assert spin_condition.wait is original and SHM_SPIN_ENV in caplog.text
    caplog.clear()
    assert apply_shm_spin({SHM_SPIN_ENV: "5", SHM_NAP_ENV: "20000"}) == 5
    assert SHM_NAP_ENV in caplog.text and "0..10000" in caplog.text
    assert spin_condition._pdfleet_spin_nap_s == 0  # the cap holds, the reader yields as vLLM does
