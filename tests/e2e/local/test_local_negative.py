"""Negative control, and a runner that dies without cleaning up.

With the connector's test-only fault hook, decode corrupts the KV blocks it pulls:
the answers still come back 200 through P/D, and the token comparison of
test_local_e2e must catch them (the comparison can fail). Then the runner is
killed with SIGKILL, which gives it no chance to stop its engines: the watchdog
and PR_SET_PDEATHSIG must leave no process behind.
"""

from __future__ import annotations

import os
import time

import psutil
import pytest

from local_fleet import Fleet, ask_all, transferred_tokens
from pdfleet.operator.local.processes import stop_groups

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(900)]

MULTI_BLOCK = ("65 tokens", "100 tokens", "200 tokens", "500 tokens", "1000 tokens")


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def group_members(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and running(p.pid):
                out.append(p.pid)
        except (ProcessLookupError, PermissionError):
            pass
    return out


async def test_corrupted_kv_is_caught_and_a_killed_runner_leaves_nothing(tmp_path, prompts, reference):
    reqs = [r for r in prompts.identity if r.label in MULTI_BLOCK]
    fleet = Fleet(tmp_path, env={"PDFLEET_TEST_CORRUPT_PULLED_BLOCKS": "1"})
    groups: list[int] = []
    try:
        fleet.wait_router()
        state = fleet.state()
        groups = [e["pgid"] for e in state["engines"]]
        decode = fleet.engine("decode")["url"]
        before = transferred_tokens(decode)
        answers = await ask_all(fleet.router, reqs, concurrency=1)
        moved = transferred_tokens(decode) - before

        assert [a.status for a in answers] == [200] * len(reqs)
        assert [a.fallback for a in answers] == [None] * len(reqs)  # P/D served them
        assert moved > 0
        wrong = [r.label for r, a in zip(reqs, answers) if a.token_ids != reference[r.label].token_ids]
        assert len(wrong) >= len(reqs) - 1, wrong

        family = psutil.Process(fleet.proc.pid).children(recursive=True)
        assert len(family) >= 5  # API servers, engine cores, workers, watchdog
        fleet.proc.kill()
        fleet.proc.wait()
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline and any(running(p.pid) for p in family):
            time.sleep(0.5)
        assert [(p.pid, p.name()) for p in family if running(p.pid)] == []
        assert {g: group_members(g) for g in groups} == {g: [] for g in groups}
    finally:
        if fleet.proc.poll() is None:
            fleet.proc.kill()
        stop_groups(groups, grace_s=5)
