"""Watchdog of `pdfleet local`: kills the runner's process groups when the runner is gone.

Started by the runner with a pipe on stdin; the runner writes `add PGID` / `del PGID`
lines. End of file means the runner exited or died (even by SIGKILL, since the
kernel closes its end of the pipe): every group still registered then gets
SIGTERM, and SIGKILL after a grace period.
"""

from __future__ import annotations

import signal
import sys

from pdfleet.operator.local.processes import stop_groups


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only end of file stops the watchdog
    groups: set[int] = set()
    for line in sys.stdin.buffer:
        parts = line.split()
        if len(parts) != 2 or not parts[1].isdigit():
            continue
        pgid = int(parts[1])
        if parts[0] == b"add":
            groups.add(pgid)
        elif parts[0] == b"del":
            groups.discard(pgid)
    if groups:
        stop_groups(sorted(groups))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
