"""The test-only fault hooks (connector/testhooks.py): their settings parsed, and inert when unset."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdfleet.connector import testhooks
from pdfleet.connector.testhooks import StuckReads, flag_path, install_wall_clock_step, parse_step
from pdfleet.contract.env import TEST_STUCK_READS, TEST_WALL_CLOCK_STEP


@pytest.mark.parametrize("value, expected", [
    (None, None),
    ("", None),
    ("1", None),  # only a file path switches these hooks
    ("relative/flag", None),
    ("/tmp/flag", "/tmp/flag"),
])
def test_flag_path_is_an_absolute_path_or_off(value, expected):
    env = {} if value is None else {TEST_STUCK_READS: value}
    assert flag_path(env, TEST_STUCK_READS) == expected


@pytest.mark.parametrize("text, step", [
    ("30", 30.0), (" -12.5\n", -12.5), ("", 0.0), ("soon", 0.0), ("nan", 0.0), ("inf", 0.0),
    ("3600", 3600.0), ("3601", 0.0), ("-1e9", 0.0),
])
def test_parse_step(text, step):
    assert parse_step(text) == step


def test_stuck_reads_is_off_when_unset_even_if_a_file_exists(tmp_path):
    flag = tmp_path / "stuck"
    flag.touch()
    assert not StuckReads({})
    assert not StuckReads({TEST_STUCK_READS: "1"})
    assert not StuckReads({TEST_STUCK_READS: "stuck"})  # relative: off


def test_stuck_reads_follows_its_file(tmp_path):
    flag = tmp_path / "stuck"
    hook = StuckReads({TEST_STUCK_READS: str(flag)})
    assert not hook
    flag.touch()
    assert hook
    flag.unlink()
    assert not hook


def test_the_sink_gets_the_stuck_reads_agent_only_with_the_variable_set(tmp_path):
    from pdfleet.connector.transfer.nixl_agent import NixlAgent

    assert testhooks.sink_nixl_agent({}) is NixlAgent
    assert testhooks.sink_nixl_agent({TEST_STUCK_READS: "stuck"}) is NixlAgent  # relative: off
    made = testhooks.sink_nixl_agent({TEST_STUCK_READS: str(tmp_path / "stuck")})
    assert made.func is testhooks.StuckReadsAgent and made.keywords["stuck"].path == str(tmp_path / "stuck")


def test_the_transfer_core_carries_no_fault_hook():
    root = Path(testhooks.__file__).parent
    hooked = {p.relative_to(root).as_posix() for p in root.rglob("*.py")
              if re.search(r"testhooks|TEST_STUCK_READS|TEST_WALL_CLOCK_STEP", p.read_text())}
    assert not {p for p in hooked if p.startswith("transfer/")}
    assert "adapter/worker.py" in hooked  # negative control: the edge that injects it is found


def test_wall_clock_hook_unset_leaves_time_alone(tmp_path):
    before = time.time
    assert install_wall_clock_step({}) is False
    assert install_wall_clock_step({TEST_WALL_CLOCK_STEP: "30"}) is False
    assert time.time is before and testhooks._installed is None


STEP_CHILD = """
import os, time
from pdfleet.connector.testhooks import install_wall_clock_step
flag = os.environ["FLAG"]
real = time.time
assert install_wall_clock_step()
m0 = time.monotonic()
def settle(want):
    deadline = time.monotonic() + 5
    while abs(time.time() - real() - want) > 0.01:
        assert time.monotonic() < deadline, (want, time.time() - real())
        time.sleep(0.01)
settle(0.0)
open(flag, "w").write("30")
settle(30.0)
os.unlink(flag)
settle(0.0)
assert time.monotonic() - m0 < 5  # the monotonic clock never stepped
print("ok")
"""


def test_wall_clock_hook_steps_time_time_while_its_file_exists(tmp_path):
    # A child process: the hook replaces time.time for the whole process.
    flag = tmp_path / "step"
    env = {"FLAG": str(flag), TEST_WALL_CLOCK_STEP: str(flag), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", STEP_CHILD], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
