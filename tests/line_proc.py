"""A child process driven over stdin/stdout JSON lines (the tests' prefill/source processes).

The child answers each command with one line ``@@pdfleet {json}``; anything else it prints
(NIXL and UCX write to stdout too) is skipped. A reader thread feeds a queue: select() on a
buffered pipe can miss lines.

Shutdown protocol: ``close()`` sends ``exit``; the child answers it (any JSON line) and then
exits 0. A child that exits 0 without answering ``exit`` has still shut down cleanly; any
other exit status, or no exit within the timeout, is an error (the child is then killed).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

MARK = "@@pdfleet "


class ChildExited(RuntimeError):
    """The child closed its stdout (exited) instead of answering."""

    def __init__(self, returncode: Optional[int]) -> None:
        super().__init__(f"child process exited with {returncode}")
        self.returncode = returncode


class LineProc:
    def __init__(self, argv: Sequence[str], *, cwd: Path, env: Optional[Mapping[str, str]] = None) -> None:
        self.proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     start_new_session=True, cwd=cwd, env=None if env is None else dict(env))
        self._lines: queue.Queue[Optional[str]] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def read(self, timeout: float = 20) -> dict:
        """The child's next answer; ``ChildExited`` if it exits first, ``TimeoutError`` if it is silent."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError("child process did not answer") from None
            if line is None:
                self._lines.put(None)  # later reads see the end too
                try:
                    rc = self.proc.wait(5)
                except subprocess.TimeoutExpired:
                    rc = None  # stdout closed but the process lives on
                raise ChildExited(rc)
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])

    def cmd(self, op: str, timeout: float = 20, **kw) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        return self.read(timeout)

    def kill(self) -> None:
        """SIGKILL the child's process group; a group that is already gone is fine."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait(10)

    def close(self, timeout: float = 10) -> int:
        """Ask the child to exit and wait for it; returns its exit status.

        Raises ``RuntimeError`` when the child did not shut down cleanly (a non-zero status,
        or neither an answer nor an exit within ``timeout``); its group is killed first.
        """
        error: Optional[str] = None
        if self.proc.poll() is None:
            try:
                self.cmd("exit", timeout=timeout)
            except (ChildExited, BrokenPipeError):
                pass  # it exited before answering: its status below tells whether cleanly
            except TimeoutError:
                error = f"child process did not answer exit within {timeout}s"
        if error is not None:
            self.kill()
            raise RuntimeError(error)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError(f"child process still running {timeout}s after exit; killed") from None
        if rc != 0:
            self.kill()  # its own children may live on in the group
            raise RuntimeError(f"child process exited with {rc}")
        return rc
