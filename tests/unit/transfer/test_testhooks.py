"""The test-only fault hooks (connector/testhooks.py): their settings parsed, inert when unset, and
only testhooks.py names a test variable (the production modules carry no test switch)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdfleet.connector import testhooks
from pdfleet.connector.testhooks import (
    CorruptPulledBlocks,
    StuckReads,
    after_pull_hook,
    corrupt_setting,
    flag_path,
    install_wall_clock_step,
    parse_step,
)
from pdfleet.contract.env import TEST_CORRUPT_PULLED_BLOCKS, TEST_STUCK_READS, TEST_WALL_CLOCK_STEP

# A test variable's name: contract.env's TEST_* constants, or a PDFLEET_TEST_* literal.
TEST_SWITCH = re.compile(r"\b(?:PDFLEET_)?TEST_[A-Z0-9_]+\b")
# The lines of adapter/worker.py that switched the corruption hook before it moved to testhooks.py.
OLD_WORKER_SWITCH = (
    'CORRUPT_ENV = "PDFLEET_TEST_CORRUPT_PULLED_BLOCKS"\n'
    "self._corrupt_when = corrupt_switch(os.environ.get(CORRUPT_ENV))\n"
)


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
              if re.search(r"testhooks|TEST_[A-Z_]+", p.read_text())}
    assert not {p for p in hooked if p.startswith("transfer/")}
    assert "adapter/worker.py" in hooked  # negative control: the edge that injects it is found


def switches_in(source: str) -> list[str]:
    return TEST_SWITCH.findall(source)


def test_production_connector_modules_carry_no_test_switch():
    """Only testhooks.py reads or names a test variable; the adapter's modules (and the rest of the
    connector) only ask it for a hook, which is None or the plain part unless a test set one."""
    root = Path(testhooks.__file__).parent
    found = {p.relative_to(root).as_posix(): names for p in sorted(root.rglob("*.py"))
             if p.name != "testhooks.py" and (names := switches_in(p.read_text()))}
    assert found == {}


@pytest.mark.parametrize("source, names", [
    # negative controls: the old worker's switch, a contract name imported, a literal read
    (OLD_WORKER_SWITCH, ["PDFLEET_TEST_CORRUPT_PULLED_BLOCKS"]),
    ("from pdfleet.contract.env import TEST_STUCK_READS\n", ["TEST_STUCK_READS"]),
    ('if os.environ.get("PDFLEET_TEST_X2"):\n', ["PDFLEET_TEST_X2"]),
    # what the edge keeps: asking testhooks for its hooks, and the counter the corruption reports to
    ("self._after_pull = after_pull_hook()\nnixl_agent=sink_nixl_agent()\n", []),
    ("self._own.blocks_corrupted_for_test += 2\nLATEST_VERSION = 3\n", []),
])
def test_the_switch_check_catches_what_it_looks_for(source, names):
    assert switches_in(source) == names


@pytest.mark.parametrize("value, setting", [
    (None, None), ("", None), ("0", None), ("true", None), ("relative/flag", None),
    ("1", ""),  # always on
    ("/tmp/flag", "/tmp/flag"),
])
def test_corrupt_setting(value, setting):
    assert corrupt_setting(value) == setting
    hook = after_pull_hook({} if value is None else {TEST_CORRUPT_PULLED_BLOCKS: value})
    assert (hook is None) == (setting is None) and (hook is None or hook.when == setting)


def kv(shape):
    import torch

    return torch.arange(float(torch.tensor(shape).prod())).reshape(shape)


@pytest.mark.parametrize("shape, axis", [
    ((6, 2, 4), 0),  # blocks first
    ((2, 6, 4), 1),  # K/V first, then blocks
])
def test_the_corruption_hook_overwrites_only_the_pulled_blocks(shape, axis):
    import torch

    caches = {"layer.0": kv(shape), "layer.1": kv(shape)}
    before = {name: t.clone() for name, t in caches.items()}
    assert CorruptPulledBlocks("")(caches, 6, (1, 4)) == 2
    for name, t in caches.items():
        for block in range(6):
            same = torch.equal(t.select(axis, block), before[name].select(axis, block))
            assert same == (block not in (1, 4)), (name, block)


def test_the_corruption_hook_follows_its_file(tmp_path):
    flag = tmp_path / "corrupt"
    hook = CorruptPulledBlocks(str(flag))
    caches = {"layer.0": kv((4, 2))}
    original = caches["layer.0"].clone()
    assert hook(caches, 4, (0,)) == 0 and caches["layer.0"].equal(original)  # off: no file
    flag.touch()
    assert hook(caches, 4, ()) == 0
    assert hook(caches, 4, (0,)) == 1 and not caches["layer.0"].equal(original)


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
