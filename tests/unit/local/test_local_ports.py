"""Where a local fleet's engines listen (issue 31): ports from outside the kernel's ephemeral range,
checked free, never overlapping; a start that failed on a taken port is recognised; an engine's
launch moved to new ports (operator/local/ports.py, fleet.with_ports, processes.reserve_ports)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pdfleet.contract import env as env_names
from pdfleet.operator.api import parse
from pdfleet.operator.local.fleet import EnginePorts, plan_local, with_ports
from pdfleet.operator.local.ports import (
    LOW_FLOOR,
    candidate_bases,
    choose_bases,
    parse_port_range,
    start_failed_on_port,
    windows_outside,
)
from pdfleet.operator.local import processes
from pdfleet.operator.local.processes import ephemeral_range, reserve_ports


@pytest.mark.parametrize("text,want", [
    ("32768\t60999\n", (32768, 60999)),
    ("1024 65535", (1024, 65535)),
    ("40000 40000", (40000, 40000)),
])
def test_parse_port_range(text, want) -> None:
    assert parse_port_range(text) == want


@pytest.mark.parametrize("text,needle", [
    ("", "expected two port numbers"),
    ("32768", "expected two port numbers"),
    ("a b", "expected two port numbers"),
    ("60999 32768", "first <= last"),
    ("0 100", "first <= last"),
    ("1024 70000", "first <= last"),
])
def test_parse_port_range_refuses_with_the_reason(text, needle) -> None:
    with pytest.raises(ValueError, match="ip_local_port_range") as exc:
        parse_port_range(text)
    assert needle in str(exc.value)


@pytest.mark.parametrize("ephemeral,want", [
    ((32768, 60999), [(LOW_FLOOR, 32767), (61000, 65535)]),  # Linux's default
    ((49152, 65535), [(LOW_FLOOR, 49151)]),  # IANA's: nothing above
    ((1024, 65535), []),  # all of it ephemeral: nothing outside (the caller falls back)
    ((5000, 20000), [(20001, 65535)]),  # below the floor: only above
    (None, [(LOW_FLOOR, 65535)]),  # unknown
])
def test_windows_outside_the_ephemeral_range(ephemeral, want) -> None:
    assert windows_outside(ephemeral) == want


def test_candidates_cover_each_base_once_from_any_start_and_fit_their_window() -> None:
    windows = [(100, 104), (200, 202)]
    for start in (0, 3, 7, -1, 10**9):
        got = list(candidate_bases(windows, 2, start))
        assert sorted(got) == [100, 101, 102, 103, 200, 201]  # 104 and 202 would run out of their window
    assert list(candidate_bases(windows, 2, 0))[:3] == [100, 101, 102]
    assert list(candidate_bases(windows, 2, 4))[:3] == [200, 201, 100]  # wraps around
    assert list(candidate_bases([(100, 101)], 3, 0)) == []  # no window holds the range


# (case, count, consecutive, candidates, busy ports, taken, want)
CHOOSE = [
    ("the first free ones", 2, 1, [10, 11, 12], set(), [], [10, 11]),
    ("busy ports skipped", 2, 1, [10, 11, 12], {10}, [], [11, 12]),
    ("a range with a busy port skipped", 1, 2, [10, 11, 12], {11}, [], [12]),
    ("ranges never overlap", 2, 2, [10, 11, 12, 13], set(), [], [10, 12]),
    ("taken ports avoided", 1, 2, [10, 11, 12], set(), [11], [12]),
    ("none asked", 0, 1, [10], set(), [], []),
]


@pytest.mark.parametrize("case,count,consecutive,candidates,busy,taken,want", CHOOSE, ids=[c[0] for c in CHOOSE])
def test_choose_bases(case, count, consecutive, candidates, busy, taken, want) -> None:
    assert choose_bases(count, consecutive, candidates, lambda p: p not in busy, taken) == want


def test_choose_bases_gives_up_with_the_count() -> None:
    with pytest.raises(ValueError, match="found 1 of 2 free port ranges of 1 after 3 candidates"):
        choose_bases(2, 1, [10, 11, 12], lambda p: p == 11)
    with pytest.raises(ValueError, match="after 5 candidates"):  # bounded work on a crowded machine
        choose_bases(1, 1, iter(range(10**9)), lambda p: False, max_tries=5)


@pytest.mark.parametrize("log,want", [
    ("pdfleet.connector.transfer.sidechannel.SideChannelError: cannot bind the side channel on "
     "127.0.0.1:55481: Address already in use", True),
    ("ERROR: [Errno 98] error while attempting to bind on address ('127.0.0.1', 41234): address already in use",
     True),
    ("zmq.error.ZMQError: Address already in use (addr='tcp://127.0.0.1:5557')", True),
    ("OSError: [Errno 98] Address in use", True),
    ("RuntimeError: Engine core initialization failed. See root cause above.", False),
    ("torch.OutOfMemoryError: ...", False),
    ("", False),
])
def test_start_failed_on_port(log, want) -> None:
    assert start_failed_on_port(log) == want


def _launches():
    spec = parse({"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "metadata": {"name": "t"},
                  "spec": {"model": {"name": "m"}, "engine": {"blockSize": 32},
                           "kvTransfer": {"bufferDevice": "cpu"}}}).spec
    ports = {"prefill": [EnginePorts(20001, 20101)], "decode": [EnginePorts(20002, 20102)]}
    return plan_local(spec, revision="r", model_path="/m", cpus=[0, 1], ports=ports, base_env={}).engines


def test_with_ports_moves_only_the_engine_ports() -> None:
    prefill, _ = _launches()
    moved = with_ports(prefill, EnginePorts(21001, 21101))
    i = moved.argv.index("--port")
    assert moved.argv[i + 1] == "21001" and moved.url == "http://127.0.0.1:21001"
    assert moved.env[env_names.SIDE_CHANNEL_PORT] == "21101" and moved.ports.side_channel == 21101
    assert "20001" not in moved.argv and "20101" not in moved.env.values()
    # everything else as planned
    assert [a for k, a in enumerate(moved.argv) if k != i + 1] == [a for k, a in enumerate(prefill.argv) if k != i + 1]
    assert {k: v for k, v in moved.env.items() if k != env_names.SIDE_CHANNEL_PORT} == {
        k: v for k, v in prefill.env.items() if k != env_names.SIDE_CHANNEL_PORT}
    assert (moved.name, moved.role, moved.cpus) == (prefill.name, prefill.role, prefill.cpus)


def test_with_ports_refuses_a_command_without_one_port() -> None:
    prefill, _ = _launches()
    from dataclasses import replace
    with pytest.raises(ValueError, match="prefill-0: its command must carry one --port PORT, found 0"):
        with_ports(replace(prefill, argv=("python", "-m", "x")), EnginePorts(1, 2))


def test_reserve_ports_are_outside_the_ephemeral_range_free_and_distinct(tmp_path: Path) -> None:
    eph = ephemeral_range()
    assert eph is not None  # Linux here
    bases = reserve_ports(4, consecutive=2, taken=[])
    ports = {b + k for b in bases for k in range(2)}
    assert len(ports) == 8
    assert all(not eph[0] <= p <= eph[1] and p >= LOW_FLOOR for p in ports), (eph, ports)
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # free


def test_reserve_ports_skips_a_busy_and_a_taken_port(monkeypatch) -> None:
    windows = windows_outside(ephemeral_range())
    first = reserve_ports(1)[0]
    window = next(w for w in windows if w[0] <= first <= w[1])
    index = sum(b - a + 1 for a, b in windows[:windows.index(window)]) + first - window[0]
    monkeypatch.setattr(processes.secrets, "randbelow", lambda n: index)  # candidates begin at `first`
    assert reserve_ports(1) == [first]  # control: the start is where the search begins
    assert first not in reserve_ports(1, taken=[first])
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", first))
        busy.listen()
        assert reserve_ports(1) != [first]
        assert first not in reserve_ports(3)
    assert ephemeral_range("/nonexistent/ip_local_port_range") is None
