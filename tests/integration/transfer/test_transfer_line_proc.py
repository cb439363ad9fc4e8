"""The test children's shutdown protocol (tests/line_proc.py): a clean exit is not an error,
an unclean one is, and killing a group that is already gone is harmless."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from line_proc import LineProc  # noqa: E402

# A child that answers "ping" and then handles "exit" as the case says.
CHILD = textwrap.dedent("""
    import json, sys, time
    mode = sys.argv[1]
    for line in sys.stdin:
        op = json.loads(line)["op"]
        if op == "ping":
            print("noise from a library"); print("@@pdfleet " + json.dumps({"pong": True}), flush=True)
        elif op == "exit":
            if mode == "answers":
                print("@@pdfleet " + json.dumps({"closed": True}), flush=True); sys.exit(0)
            if mode == "silent":
                sys.exit(0)
            if mode == "fails":
                sys.exit(3)
            if mode == "hangs":
                time.sleep(60)
""")


def child(mode: str) -> LineProc:
    proc = LineProc([sys.executable, "-c", CHILD, mode], cwd=Path.cwd())
    assert proc.cmd("ping") == {"pong": True}  # lines without the mark are skipped
    return proc


@pytest.mark.parametrize("mode", ["answers", "silent"])
def test_a_clean_exit_is_not_an_error(mode):
    proc = child(mode)
    assert proc.close(timeout=10) == 0
    assert proc.close(timeout=10) == 0  # closing twice is harmless (the child is gone)
    proc.kill()  # so is killing a group that no longer exists


def test_a_failing_exit_is_an_error():
    proc = child("fails")
    with pytest.raises(RuntimeError, match="exited with 3"):
        proc.close(timeout=10)


def test_a_child_that_does_not_exit_is_killed_and_reported():
    proc = child("hangs")
    with pytest.raises(RuntimeError, match="did not answer exit"):
        proc.close(timeout=1)
    assert proc.proc.returncode == -9


def test_reading_from_an_exited_child_says_so():
    proc = child("silent")
    proc.proc.stdin.close()  # EOF: the child's loop ends and it exits 0 without a word
    from line_proc import ChildExited

    with pytest.raises(ChildExited) as exc:
        proc.read(10)
    assert exc.value.returncode == 0
