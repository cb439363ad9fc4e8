"""A bound on vLLM's lost wake-ups between an engine core and its workers (applied in the engine's processes).

vLLM 0.32's engine core and its workers hand each step over a shared-memory queue. A reader that
has not read for a second stops spinning and parks on a ZMQ PUB/SUB notification; that
notification can be lost (vLLM's own comment in shm_broadcast.py), and the reader then sleeps
until its re-check interval, 5 s, even though the step it waits for is done. On a machine where
engines share CPUs (a local fleet of 3 engines on 2 cores) the ZMQ I/O threads, pinned with the
worker to its CPU, are starved by the spinning readers there and notifications are lost often:
steps that take milliseconds took 5 s, again and again, and leases ran out (docs/reliability.md,
"Why fresh local fleets wedged").

With ``PDFLEET_VLLM_SHM_RECHECK_MS`` set (``pdfleet local`` sets it), the connector lowers that
re-check interval in the process it is loaded in (engine core and workers alike), so a lost
notification costs at most that many milliseconds. The interval is a module global read on every
wait, so lowering it takes effect for waits that start afterwards. Unset: vLLM is left alone.

The second cause is the spinning itself: after each read a reader spins on ``sched_yield`` for a
second (``SpinCondition.busy_loop_s``) before it parks. An engine idle between requests thus burns
its CPU for a second after every step, which on a shared CPU is taken from the other engine (and
from its side channel, whose replies decode waits on). With ``PDFLEET_VLLM_SHM_SPIN_MS`` set
(``pdfleet local`` sets it for engines that share a CPU), readers spin at most that long; the
writer notifies after every write, so a parked reader wakes on the notification (or the re-check).

The third is how it spins: ``sched_yield`` keeps the reader runnable, and the kernel's fair scheduler
gives an always-runnable thread its share of a CPU whatever it yields, so a reader waiting for the
next step can take up to half of the CPU from the engine working beside it. With
``PDFLEET_VLLM_SHM_SPIN_NAP_US`` also set (``pdfleet local`` sets 1,000 with the cap), a reader
inside its spin window sleeps that long between polls instead: off the run queue while it waits,
at most one nap late to a step. Measured on 2 + 1 fleets on 2 CPUs: 121-142 ms of the fleet's CPU
per request instead of 180-214, and a fresh fleet's first round at 600-798 requests/min instead of
491-679 (docs/reliability.md).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Mapping, Optional

from pdfleet.contract.env import (
    VLLM_SHM_RECHECK_MS as SHM_RECHECK_ENV, VLLM_SHM_SPIN_MS as SHM_SPIN_ENV, VLLM_SHM_SPIN_NAP_US as SHM_NAP_ENV,
)

__all__ = ["SHM_NAP_ENV", "SHM_RECHECK_ENV", "SHM_SPIN_ENV", "shm_recheck_ms", "shm_spin_ms", "shm_spin_nap_us",
           "apply_shm_recheck", "apply_shm_spin"]

log = logging.getLogger(__name__)

_MAX_MS = 5000  # vLLM's own interval: never raise it


def shm_recheck_ms(value: Optional[str]) -> Optional[int]:
    """The interval a setting asks for (ms), or None when unset or not an integer in 1..5000."""
    if value is None or not value.strip().isdigit():
        return None
    ms = int(value.strip())
    return ms if 1 <= ms <= _MAX_MS else None


def apply_shm_recheck(env: Mapping[str, str] = os.environ) -> Optional[int]:
    """Lower vLLM's shared-memory reader re-check interval as ``env`` asks; returns the interval in force."""
    raw = env.get(SHM_RECHECK_ENV)
    ms = shm_recheck_ms(raw)
    if ms is None:
        if raw is not None:
            log.warning("%s=%r ignored: an integer number of milliseconds in 1..%d is allowed",
                        SHM_RECHECK_ENV, raw, _MAX_MS)
        return None
    try:
        from vllm.distributed.device_communicators import shm_broadcast
    except ImportError:
        return None
    current = getattr(shm_broadcast, "SHM_READER_RECHECK_INTERVAL_MS", None)
    if not isinstance(current, int):
        log.warning("%s ignored: this vLLM has no SHM_READER_RECHECK_INTERVAL_MS", SHM_RECHECK_ENV)
        return None
    if ms < current:
        shm_broadcast.SHM_READER_RECHECK_INTERVAL_MS = ms
        log.info("vLLM shared-memory readers re-check every %d ms (was %d ms): %s", ms, current, SHM_RECHECK_ENV)
    return min(ms, current)


_MAX_SPIN_MS = 1000  # vLLM's own busy loop: never lengthen it
_MAX_NAP_US = 10_000  # a nap is added to a step's hand-over: keep it far below a step
_PATCHED = "_pdfleet_spin_cap_s"
_NAP = "_pdfleet_spin_nap_s"


def shm_spin_ms(value: Optional[str]) -> Optional[int]:
    """The spin cap a setting asks for (ms, 0 = park at once), or None when unset or not an integer in 0..1000."""
    if value is None or not value.strip().isdigit():
        return None
    ms = int(value.strip())
    return ms if 0 <= ms <= _MAX_SPIN_MS else None


def shm_spin_nap_us(value: Optional[str]) -> Optional[int]:
    """The nap between polls a setting asks for (µs, 0 = sched_yield as vLLM), or None when unset or not an
    integer in 0..10000."""
    if value is None or not value.strip().isdigit():
        return None
    us = int(value.strip())
    return us if 0 <= us <= _MAX_NAP_US else None


def apply_shm_spin(env: Mapping[str, str] = os.environ) -> Optional[int]:
    """Cap how long vLLM's shared-memory readers spin after a read, as ``env`` asks; returns the cap in ms.
    With a nap set too, readers poll inside that window with a sleep instead of ``sched_yield``.

    ``busy_loop_s`` is set per reader when vLLM builds its queues, before the connector loads, so the
    cap is applied in ``SpinCondition.wait`` (looked up on every wait) to the reader that waits."""
    raw = env.get(SHM_SPIN_ENV)
    ms = shm_spin_ms(raw)
    raw_nap = env.get(SHM_NAP_ENV)
    nap_us = shm_spin_nap_us(raw_nap)
    if raw_nap is not None and nap_us is None:
        log.warning("%s=%r ignored: an integer number of microseconds in 0..%d is allowed",
                    SHM_NAP_ENV, raw_nap, _MAX_NAP_US)
    if ms is None:
        if raw is not None:
            log.warning("%s=%r ignored: an integer number of milliseconds in 0..%d is allowed",
                        SHM_SPIN_ENV, raw, _MAX_SPIN_MS)
        if nap_us:
            log.warning("%s ignored: it applies inside the spin window %s sets, and that is unset",
                        SHM_NAP_ENV, SHM_SPIN_ENV)
        return None
    try:
        from vllm.distributed.device_communicators.shm_broadcast import SpinCondition
    except ImportError:
        return None
    wait = getattr(SpinCondition, "wait", None)
    if wait is None:
        log.warning("%s ignored: this vLLM's shared-memory readers do not spin", SHM_SPIN_ENV)
        return None
    cap = ms / 1000
    if hasattr(SpinCondition, _PATCHED):  # already capped in this process (both roles load the connector)
        cap = min(cap, getattr(SpinCondition, _PATCHED))
        setattr(SpinCondition, _PATCHED, cap)
        if nap_us is not None and not getattr(SpinCondition, _NAP):
            setattr(SpinCondition, _NAP, nap_us / 1e6)
        return round(cap * 1000)

    def capped_wait(self, timeout_ms=None):
        limit = getattr(SpinCondition, _PATCHED)
        if getattr(self, "busy_loop_s", 0) > limit:
            self.busy_loop_s = limit
        nap = getattr(SpinCondition, _NAP)
        if nap and time.monotonic() <= self.last_read + self.busy_loop_s:
            time.sleep(nap)  # vLLM's spin branch, off the run queue: the caller re-checks the buffer
            return None
        return wait(self, timeout_ms)

    setattr(SpinCondition, _PATCHED, cap)
    setattr(SpinCondition, _NAP, (nap_us or 0) / 1e6)
    SpinCondition.wait = capped_wait
    log.info("vLLM shared-memory readers spin at most %d ms after a read (was 1 s)%s: %s", ms,
             f", polling every {nap_us} us with a sleep" if nap_us else "", SHM_SPIN_ENV)
    return ms
