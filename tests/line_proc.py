"""A child process driven over stdin/stdout JSON lines (the tests' prefill/source processes).

The child answers each command with one line ``@@pdfleet {json}``; anything else it prints
(NIXL and UCX write to stdout too) is skipped. A reader thread feeds a queue: select() on a
buffered pipe can miss lines.
"""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

MARK = "@@pdfleet "


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
        """The child's next answer."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError("child process did not answer") from None
            if line is None:
                raise RuntimeError(f"child process exited with {self.proc.wait(5)}")
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])

    def cmd(self, op: str, timeout: float = 20, **kw) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        return self.read(timeout)
