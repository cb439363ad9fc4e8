"""Test-only fault hooks for the fault suite (`make chaos`); inert unless their variable is set.

Each hook is switched by an environment variable naming an absolute file path (any other value,
or none, leaves it off; the corruption hook also takes "1": always on); while that file exists the
fault is on, so one engine serves a fault and the requests after it without a restart:

- ``PDFLEET_TEST_STUCK_READS``: a decode's NIXL READs are created but never posted, so they stay
  in progress as a READ on a hung connection would: the sink's own read bound must cancel them.
  The adapter's worker makes its sink's agent with ``sink_nixl_agent()``: ``StuckReadsAgent``
  with the variable set, else the plain ``NixlAgent`` (the transfer core carries no test switch).
- ``PDFLEET_TEST_WALL_CLOCK_STEP``: the process's ``time.time`` (the only wall clock the connector
  reads) is stepped by the seconds the file holds, as an NTP step would; leases must not notice.
- ``PDFLEET_TEST_CORRUPT_PULLED_BLOCKS``: every block a decode worker pulled is overwritten with
  noise before vLLM sees it (the end-to-end tests' negative controls: the comparison can fail).
  The adapter's worker asks ``after_pull_hook()`` for what to call on a finished pull's blocks:
  ``CorruptPulledBlocks`` with the variable set, else None.

They exist for the fault suite and the end-to-end tests and must never be set in production (each
logs a warning when on; a fleet's spec may not set them).
"""

from __future__ import annotations

import functools
import logging
import math
import os
import threading
import time
from typing import Any, Callable, Mapping, Optional

from pdfleet.connector.transfer.nixl_agent import NixlAgent
from pdfleet.contract.env import TEST_CORRUPT_PULLED_BLOCKS, TEST_STUCK_READS, TEST_WALL_CLOCK_STEP

__all__ = ["flag_path", "parse_step", "StuckReads", "StuckReadsAgent", "sink_nixl_agent", "install_wall_clock_step",
           "corrupt_setting", "CorruptPulledBlocks", "after_pull_hook"]

log = logging.getLogger(__name__)

# A step beyond this is refused (a typo must not move an engine's clock by a year).
MAX_STEP_SECONDS = 3600.0
# How often the wall-clock hook looks at its file (a thread; time.time itself stays one addition).
POLL_SECONDS = 0.05


def flag_path(env: Mapping[str, str], name: str) -> Optional[str]:
    """The hook's file, or None (off) unless ``env[name]`` is an absolute path."""
    value = env.get(name)
    return value if value and os.path.isabs(value) else None


def parse_step(text: str) -> float:
    """Seconds to step the wall clock by, from the file's text: a finite number within
    ``MAX_STEP_SECONDS`` either way; anything else is no step (0.0)."""
    try:
        step = float(text.strip() or 0)
    except ValueError:
        return 0.0
    return step if math.isfinite(step) and abs(step) <= MAX_STEP_SECONDS else 0.0


class StuckReads:
    """Whether READs posted now must hang (``PDFLEET_TEST_STUCK_READS``'s file exists)."""

    def __init__(self, env: Mapping[str, str] = os.environ) -> None:
        self.path = flag_path(env, TEST_STUCK_READS)
        if self.path is not None:
            log.warning("%s is set: NIXL READs will never be posted while %s exists (test-only fault hook)",
                        TEST_STUCK_READS, self.path)

    def __bool__(self) -> bool:
        return self.path is not None and os.path.exists(self.path)


class StuckReadsAgent(NixlAgent):
    """A NixlAgent whose READs, while ``stuck`` is on, are created but never posted: "in progress" forever."""

    def __init__(self, *args: Any, stuck: StuckReads, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stuck = stuck
        self._unposted: set[Any] = set()  # READs held back

    def post(self, peer: str, handle: Any) -> Any:
        if self._stuck:
            self._unposted.add(handle)
            return handle
        return super().post(peer, handle)

    def state(self, handle: Any) -> str:
        return "PROC" if handle in self._unposted else super().state(handle)

    def release(self, handle: Any) -> bool:
        self._unposted.discard(handle)
        return super().release(handle)


def sink_nixl_agent(env: Mapping[str, str] = os.environ) -> Callable[..., NixlAgent]:
    """What a decode's sink makes its NIXL agent with (``KVSink(nixl_agent=...)``): ``StuckReadsAgent``
    while ``PDFLEET_TEST_STUCK_READS`` names a file path, else ``NixlAgent`` itself."""
    stuck = StuckReads(env)
    return NixlAgent if stuck.path is None else functools.partial(StuckReadsAgent, stuck=stuck)


def corrupt_setting(value: Optional[str]) -> Optional[str]:
    """``PDFLEET_TEST_CORRUPT_PULLED_BLOCKS``'s value as None (off), "" (always on) or the file whose
    existence turns it on."""
    return "" if value == "1" else flag_path({TEST_CORRUPT_PULLED_BLOCKS: value or ""}, TEST_CORRUPT_PULLED_BLOCKS)


class CorruptPulledBlocks:
    """Overwrites the local blocks of a finished pull with noise while on (always, or while its file exists)."""

    def __init__(self, when: str) -> None:
        self.when = when  # "" (always) or a file path
        log.warning("%s is set: pulled KV blocks will be CORRUPTED %s (test-only fault hook)",
                    TEST_CORRUPT_PULLED_BLOCKS, "always" if when == "" else f"while {when} exists")

    def __bool__(self) -> bool:
        return self.when == "" or os.path.exists(self.when)

    def __call__(self, kv_caches: Mapping[str, Any], num_blocks: int, block_ids: tuple[int, ...]) -> int:
        """Corrupt ``block_ids`` in every KV tensor (blocks on axis 0, or on axis 1 when axis 0 is not
        ``num_blocks`` long); the number of blocks corrupted."""
        if not block_ids or not self:
            return 0
        import torch

        idx = torch.tensor(block_ids, dtype=torch.long)
        gen = torch.Generator().manual_seed(1234)
        for t in kv_caches.values():
            axis = 0 if t.shape[0] == num_blocks else 1
            view = t.index_select(axis, idx)
            noise = torch.randn(view.shape, generator=gen, dtype=torch.float32).to(view.dtype) * 4
            t.index_copy_(axis, idx, noise)
        return len(block_ids)


def after_pull_hook(env: Mapping[str, str] = os.environ) -> Optional[CorruptPulledBlocks]:
    """What a decode worker calls on the local blocks of each finished pull (``hook(kv_caches, num_blocks,
    block_ids)``, returning the blocks it corrupted): ``CorruptPulledBlocks`` while
    ``PDFLEET_TEST_CORRUPT_PULLED_BLOCKS`` is set, else None."""
    when = corrupt_setting(env.get(TEST_CORRUPT_PULLED_BLOCKS))
    return None if when is None else CorruptPulledBlocks(when)


_installed: Optional["_WallStep"] = None
_install_lock = threading.Lock()


class _WallStep:
    def __init__(self, path: str, real: Callable[[], float]) -> None:
        self.path = path
        self.real = real
        self.offset = 0.0

    def time(self) -> float:
        return self.real() + self.offset

    def watch(self) -> None:
        while True:
            try:
                with open(self.path) as f:
                    step = parse_step(f.read(64))
            except OSError:  # no file: no step
                step = 0.0
            if step != self.offset:
                log.warning("test-only fault hook: wall clock (time.time) stepped by %+.3gs, now %+.3gs"
                            " from the real clock", step - self.offset, step)
                self.offset = step
            time.sleep(POLL_SECONDS)


def install_wall_clock_step(env: Mapping[str, str] = os.environ) -> bool:
    """With ``PDFLEET_TEST_WALL_CLOCK_STEP`` set, replace ``time.time`` in this process by the real
    clock plus the step its file holds (read every ``POLL_SECONDS``); once per process. Returns
    whether the hook is on. ``time.monotonic`` is left alone."""
    global _installed
    path = flag_path(env, TEST_WALL_CLOCK_STEP)
    if path is None:
        return False
    with _install_lock:
        if _installed is None:
            log.warning("%s is set: time.time is stepped by the seconds in %s while it exists"
                        " (test-only fault hook)", TEST_WALL_CLOCK_STEP, path)
            _installed = _WallStep(path, time.time)
            time.time = _installed.time
            threading.Thread(target=_installed.watch, name="pdfleet-test-wall-step", daemon=True).start()
    return True
