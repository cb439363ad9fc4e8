"""Child processes of `pdfleet local`: free ports, start, watch, stop (I/O only).

Every engine runs in its own process group (its API server, engine core and
workers), so stopping it means signalling the group. Three layers make sure no
process outlives the runner:

1. the runner stops every group on exit, Ctrl-C or SIGTERM (SIGTERM, then SIGKILL);
2. each engine's API server gets PR_SET_PDEATHSIG, so it dies with the runner;
3. a watchdog process (watchdog.py) holds the read end of a pipe from the runner
   and knows every group; when the runner dies in any way (even SIGKILL) the pipe
   closes and the watchdog kills whatever is left in those groups.

With scale to zero the engines are forked by a pre-imported launcher instead (launcher.py): the same
session, group, parent-death signal and watchdog registration, a ``launcher.Launched`` as ``Child.proc``.
"""

from __future__ import annotations

import ctypes
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Mapping, Optional, Sequence

from pdfleet.operator.local.ports import Window, candidate_bases, choose_bases, parse_port_range, windows_outside

PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 15.0


EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"


def ephemeral_range(path: str = EPHEMERAL_RANGE_FILE) -> Optional[Window]:
    """The kernel's ephemeral port range, None where it cannot be read (then every port is a candidate)."""
    try:
        return parse_port_range(Path(path).read_text())
    except (OSError, ValueError):
        return None


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def reserve_ports(count: int, consecutive: int = 1, host: str = "127.0.0.1", taken: Sequence[int] = ()) -> list[int]:
    """`count` distinct base ports, each followed by `consecutive - 1` free ports, none in `taken`.

    Chosen outside the ephemeral range (ports.py: sockets opened later without a port never get
    them), from a random point so that runs side by side spread out, each port checked by binding
    it. Another process may still name one before the engine binds it: the runner then starts that
    engine again on new ports.
    """
    windows = windows_outside(ephemeral_range()) or windows_outside(None)
    bases = candidate_bases(windows, consecutive, secrets.randbelow(1 << 30))
    try:
        return choose_bases(count, consecutive, bases, lambda p: port_free(p, host), taken)
    except ValueError as exc:
        raise RuntimeError(f"could not find {count} free port ranges of {consecutive}: {exc}") from None


def read_since(path: Path, offset: int, limit: int = 64 * 1024) -> str:
    """The log's text from `offset` (at most its last `limit` bytes); empty when it cannot be read."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(offset, size - limit) if size > offset else size)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _parent_death_signal(parent: int):
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:  # the runner died between fork and prctl
            os._exit(1)

    return preexec


@dataclass
class Child:
    name: str
    proc: Any  # subprocess.Popen, or launcher.Launched (pid, poll, returncode) for an engine the launcher forked
    log_path: Path

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def pgid(self) -> int:
        return self.proc.pid  # started as a session (and group) leader

    def alive(self) -> bool:
        return self.proc.poll() is None


def start_child(name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path, cwd: Path) -> Child:
    """Start `argv` in a new session, output to `log_path`, dying with this process."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            env={**os.environ, **env},
            cwd=cwd,  # never the repository root: its `operator/` folder would shadow the stdlib module
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_parent_death_signal(os.getpid()),
        )
    return Child(name, proc, log_path)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_groups(pgids: Sequence[int], procs: Sequence[Any] = (), grace_s: float = STOP_GRACE_S) -> None:
    """Stop whole process groups whose leader is the group id (as start_child makes them).

    A live leader gets SIGTERM alone first, so vLLM's API server shuts its engine core and
    workers down in order; after `grace_s` (or at once for a group whose leader is gone)
    everything left in the group gets SIGKILL.
    """
    for p in procs:
        p.poll()  # reap exited children so a dead leader is seen as dead
    for pgid in pgids:
        _signal_leader(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        for p in procs:
            p.poll()
        if not any(group_alive(g) for g in pgids):
            return
        for pgid in pgids:
            if not _leader_alive(pgid):
                _signal_group(pgid, signal.SIGKILL)  # orphans of a dead leader: nobody will stop them
        time.sleep(0.1)
    for pgid in pgids:
        _signal_group(pgid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        for p in procs:
            p.poll()
        if not any(group_alive(g) for g in pgids):
            return
        time.sleep(0.05)


def _leader_alive(pgid: int) -> bool:
    try:
        with open(f"/proc/{pgid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return False
    return fields[0] != "Z" and int(fields[2]) == pgid  # state, pgrp: still our group's leader


def _signal_leader(pgid: int, sig: int) -> None:
    if _leader_alive(pgid):
        try:
            os.kill(pgid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError as exc:
        return f"(cannot read {path}: {exc.strerror})"


class Watchdog:
    """The process that kills every registered group once this process is gone."""

    def __init__(self, cwd: Path, python: str = sys.executable) -> None:
        self.proc = subprocess.Popen(
            [python, "-m", "pdfleet.operator.local.watchdog", str(os.getpid())],
            stdin=subprocess.PIPE,
            cwd=cwd,
            start_new_session=True,  # a Ctrl-C to the terminal's group must not stop it before the runner
        )
        self._pipe: Optional[IO[bytes]] = self.proc.stdin

    def watch(self, pgid: int) -> None:
        self._send(f"add {pgid}\n")

    def forget(self, pgid: int) -> None:
        self._send(f"del {pgid}\n")

    def _send(self, line: str) -> None:
        if self._pipe is None:
            return
        try:
            self._pipe.write(line.encode())
            self._pipe.flush()
        except BrokenPipeError:
            self._pipe = None

    def close(self, timeout: float = 30.0) -> None:
        """Close the pipe (the watchdog then stops what is left) and wait for it."""
        if self._pipe is not None:
            try:
                self._pipe.close()
            except BrokenPipeError:
                pass
            self._pipe = None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
