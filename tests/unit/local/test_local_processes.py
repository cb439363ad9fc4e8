"""Child processes of `pdfleet local`: groups stop whole, and nothing outlives a killed runner."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

from waits import wait_until

from pdfleet.operator.local.processes import group_alive, log_tail, reserve_ports, start_child, stop_groups

# A child that starts a grandchild in its own group (like vLLM's engine core) and ignores SIGTERM
# when asked to, so stop_groups has to escalate.
FAMILY = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    if sys.argv[1] == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    grandchild = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    print(grandchild.pid, flush=True)
    time.sleep(120)
""")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def start_family(tmp_path: Path, mode: str):
    script = tmp_path / "family.py"
    script.write_text(FAMILY)
    log = tmp_path / f"{mode}.log"
    child = start_child(mode, [sys.executable, str(script), mode], {}, log, cwd=tmp_path)
    assert wait_until(lambda: log.read_text().strip() != "", timeout=20.0)
    return child, int(log.read_text().split()[0])


def test_reserve_ports_gives_distinct_free_ranges():
    bases = reserve_ports(3, consecutive=2)
    ports = {b + k for b in bases for k in range(2)}
    assert len(ports) == 6
    for port in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free after the reservation is released


def test_child_runs_in_its_own_group_and_stops_whole(tmp_path):
    child, grandchild = start_family(tmp_path, "polite")
    assert os.getpgid(child.pid) == child.pid != os.getpgid(0)
    assert os.getpgid(grandchild) == child.pgid
    stop_groups([child.pgid], [child.proc], grace_s=10)
    assert not group_alive(child.pgid)
    assert gone(child.pid) and gone(grandchild)


def test_stop_escalates_to_sigkill(tmp_path):
    child, grandchild = start_family(tmp_path, "stubborn")
    started = time.monotonic()
    stop_groups([child.pgid], [child.proc], grace_s=1)
    assert time.monotonic() - started < 8
    assert child.proc.returncode == -signal.SIGKILL
    assert wait_until(lambda: gone(grandchild), timeout=5)


RUNNER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    from pdfleet.operator.local.processes import Watchdog, start_child
    out = Path(sys.argv[1])
    watchdog = Watchdog(cwd=out)
    child = start_child("family", [sys.executable, str(out / "family.py"), "polite"], {}, out / "family.log", cwd=out)
    watchdog.watch(child.pgid)
    while not (out / "family.log").read_text().strip():
        time.sleep(0.05)
    grandchild = int((out / "family.log").read_text().split()[0])
    (out / "pids.json").write_text(json.dumps({"child": child.pid, "grandchild": grandchild,
                                               "watchdog": watchdog.proc.pid}))
    time.sleep(120)
""")


def test_killed_runner_leaves_nothing_behind(tmp_path):
    """SIGKILL gives the runner no chance to clean up: the watchdog and PDEATHSIG must."""
    (tmp_path / "family.py").write_text(FAMILY)
    (tmp_path / "runner.py").write_text(RUNNER)
    runner = subprocess.Popen([sys.executable, str(tmp_path / "runner.py"), str(tmp_path)], cwd=tmp_path)
    try:
        assert wait_until(lambda: (tmp_path / "pids.json").exists(), timeout=20.0)
        pids = json.loads((tmp_path / "pids.json").read_text())
        assert not gone(pids["grandchild"])
        runner.kill()
        runner.wait()
        assert wait_until(lambda: all(gone(p) for p in pids.values()), timeout=30), {
            name: not gone(pid) for name, pid in pids.items()
        }
        assert not group_alive(pids["child"])
    finally:
        if runner.poll() is None:
            runner.kill()


def test_log_tail_keeps_the_last_lines(tmp_path):
    log = tmp_path / "x.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert log_tail(log, 3) == "line 97\nline 98\nline 99\n"
    assert "cannot read" in log_tail(tmp_path / "missing.log")
