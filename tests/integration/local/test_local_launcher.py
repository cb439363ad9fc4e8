"""The pre-imported launcher (operator/local/launcher.py) with a trivial module instead of vLLM: a forked
child gets the engine's arguments, environment, working directory, log and its own session; it can spawn
(as vLLM's engine core does); its exit status comes back; its group stops whole; the launcher refuses
what it must (another module, a launcher with a second thread) and stops its children when the runner closes it."""

from __future__ import annotations

import json
import os
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest
from waits import wait_until

from pdfleet.operator.local.launcher import Launcher, LauncherError
from pdfleet.operator.local.processes import group_alive, stop_groups

# Imported by the launcher once; run as __main__ in each child.
ENGINE = textwrap.dedent("""
    import json, multiprocessing, os, sys, time

    from engine_dep import IMPORTED_IN  # what the launcher imported once: not again in the child

    def spawned(q):
        q.put(os.environ.get("ENGINE_VAR"))

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("spawn")  # vLLM's engine core and worker on CPU
        q = ctx.Queue()
        p = ctx.Process(target=spawned, args=(q,))
        p.start()
        from_spawned = q.get(timeout=60)
        p.join()
        print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(), "var": os.environ.get("ENGINE_VAR"),
                          "own_session": os.getsid(0) == os.getpid() == os.getpgid(0),
                          "imported_elsewhere": IMPORTED_IN != os.getpid(), "spawned": from_spawned}), flush=True)
        if sys.argv[1] == "sleep":
            time.sleep(120)
        sys.exit(int(sys.argv[2]))
""")
THREADED = "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"


def _launcher(tmp_path: Path, module: str, source: str) -> Launcher:
    (tmp_path / "mods").mkdir(exist_ok=True)
    (tmp_path / "mods" / f"{module}.py").write_text(source)
    (tmp_path / "mods" / "engine_dep.py").write_text("import os\nIMPORTED_IN = os.getpid()\n")
    return Launcher.start(module, {"PYTHONPATH": str(tmp_path / "mods")}, tmp_path / "launcher.log", tmp_path)


def _first_json(log: Path) -> dict:
    assert wait_until(lambda: log.exists() and log.read_text().strip(), timeout=60.0), log
    return json.loads(log.read_text().splitlines()[0])


def test_a_forked_engine_runs_as_start_child_would_and_its_end_is_reported(tmp_path):
    launcher = _launcher(tmp_path, "tiny_engine", ENGINE)
    try:
        assert launcher.wait_ready(60.0)["ready"]
        work = tmp_path / "work"
        work.mkdir()
        proc = launcher.fork([sys.executable, "-m", "tiny_engine", "exit", "3"], {"ENGINE_VAR": "v1"},
                             tmp_path / "e1.log", work)
        assert wait_until(lambda: proc.poll() is not None, timeout=60.0)
        assert proc.returncode == 3
        assert _first_json(tmp_path / "e1.log") == {
            "argv": ["exit", "3"], "cwd": str(work), "var": "v1", "own_session": True, "imported_elsewhere": True,
            "spawned": "v1"}

        # A second engine from the same launcher; stopped by its group, like any engine.
        proc = launcher.fork([sys.executable, "-m", "tiny_engine", "sleep", "0"], {"ENGINE_VAR": "v2"},
                             tmp_path / "e2.log", work)
        assert _first_json(tmp_path / "e2.log")["var"] == "v2"
        assert proc.poll() is None and group_alive(proc.pid)
        stop_groups([proc.pid], [proc], grace_s=10.0)
        assert not group_alive(proc.pid)
        assert wait_until(lambda: proc.poll() is not None, timeout=10.0)
        assert proc.returncode == -signal.SIGTERM

        with pytest.raises(LauncherError, match="not `python -m tiny_engine"):
            launcher.fork([sys.executable, "-m", "other"], {}, tmp_path / "e3.log", work)

        # Still serving after a refusal; closing the launcher stops what it runs.
        proc = launcher.fork([sys.executable, "-m", "tiny_engine", "sleep", "0"], {}, tmp_path / "e4.log", work)
        _first_json(tmp_path / "e4.log")
    finally:
        launcher.close(30.0)
    assert launcher.proc.returncode == 0
    assert wait_until(lambda: not group_alive(proc.pid), timeout=10.0)


def test_a_launcher_with_a_second_thread_does_not_fork(tmp_path):
    launcher = _launcher(tmp_path, "threaded_engine", THREADED)
    try:
        with pytest.raises(LauncherError, match="2 threads after importing threaded_engine: a fork is unsafe"):
            launcher.wait_ready(60.0)
        with pytest.raises(LauncherError, match="not serving"):
            launcher.fork([sys.executable, "-m", "threaded_engine"], {}, tmp_path / "e.log", tmp_path)
    finally:
        launcher.close(30.0)
    assert launcher.proc.returncode == 1


def test_the_launcher_dies_with_its_runner_side_closed_and_takes_its_children(tmp_path):
    launcher = _launcher(tmp_path, "tiny_engine", ENGINE)
    assert launcher.wait_ready(60.0)["ready"]
    proc = launcher.fork([sys.executable, "-m", "tiny_engine", "sleep", "0"], {}, tmp_path / "e.log", tmp_path)
    _first_json(tmp_path / "e.log")
    os.kill(launcher.proc.pid, signal.SIGKILL)  # the launcher gone: its children get their parent-death signal
    launcher.proc.wait(10.0)
    assert wait_until(lambda: proc.poll() is not None, timeout=20.0)  # seen gone without the launcher's report
    time.sleep(0.1)
    launcher.close(5.0)
