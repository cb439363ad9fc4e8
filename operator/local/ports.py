"""Which ports a local fleet's engines listen on (pure: the caller says which ports are free).

Ports chosen ahead of time inside the kernel's ephemeral range (net.ipv4.ip_local_port_range) can
be handed by the kernel to any socket opened later without a port, such as vLLM's own ZMQ and
torch.distributed sockets, before the engine binds its HTTP port or its side channel (issue 31:
``cannot bind the side channel on 127.0.0.1:55481: Address already in use``). So ports come from
outside that range, where only a process that names a port takes it; the caller still checks
each candidate by binding it, and an engine whose start fails on a port taken anyway (another
program named it in between) is started again on new ports (``start_failed_on_port``).
"""

from __future__ import annotations

from typing import Callable, Iterable, Iterator, Optional, Sequence

PORT_MAX = 65535
# The lowest port a local fleet uses: below it lie the ports services are commonly configured on.
LOW_FLOOR = 10000
# Candidates tried before giving up (each costs one bind): plenty on any machine with free ports.
MAX_TRIES = 4096
Window = tuple[int, int]  # first and last port, inclusive


def parse_port_range(text: str) -> Window:
    """The content of /proc/sys/net/ipv4/ip_local_port_range ("32768\\t60999") as (first, last)."""
    fields = text.split()
    try:
        first, last = (int(f) for f in fields)
    except ValueError:
        raise ValueError(f"ip_local_port_range: expected two port numbers, got {text.strip()!r}") from None
    if not 1 <= first <= last <= PORT_MAX:
        raise ValueError(f"ip_local_port_range: expected 1 <= first <= last <= {PORT_MAX}, got {first} {last}")
    return first, last


def windows_outside(ephemeral: Optional[Window], floor: int = LOW_FLOOR, ceiling: int = PORT_MAX) -> list[Window]:
    """The port windows in [floor, ceiling] outside the ephemeral range (None: unknown, all of it)."""
    if ephemeral is None:
        return [(floor, ceiling)]
    lo, hi = ephemeral
    out = []
    if lo - 1 >= floor:
        out.append((floor, min(lo - 1, ceiling)))
    if hi + 1 <= ceiling:
        out.append((max(hi + 1, floor), ceiling))
    return out


def candidate_bases(windows: Sequence[Window], consecutive: int, start: int) -> Iterator[int]:
    """Every base port whose ``consecutive`` ports lie inside one window, once each, beginning at
    position ``start`` (taken modulo their number, so any integer spreads runs apart) and wrapping."""
    slots = [(a, b - consecutive + 1) for a, b in windows if b - a + 1 >= consecutive]
    total = sum(last - first + 1 for first, last in slots)
    for k in range(total):
        i = (start + k) % total
        for first, last in slots:
            if i <= last - first:
                yield first + i
                break
            i -= last - first + 1


def choose_bases(count: int, consecutive: int, candidates: Iterable[int], is_free: Callable[[int], bool],
                 taken: Iterable[int] = (), max_tries: int = MAX_TRIES) -> list[int]:
    """``count`` base ports from ``candidates`` whose ``consecutive`` ports are all free, overlap no
    other chosen range nor ``taken``; ValueError when ``max_tries`` candidates do not give that many."""
    if count < 0 or consecutive < 1:
        raise ValueError(f"count must be >= 0 and consecutive >= 1, got {count} and {consecutive}")
    held = set(taken)
    bases: list[int] = []
    tries = 0
    for base in candidates:
        if len(bases) == count:
            break
        if tries >= max_tries:
            break
        tries += 1
        span = range(base, base + consecutive)
        if any(p in held for p in span) or not all(is_free(p) for p in span):
            continue
        bases.append(base)
        held.update(span)
    if len(bases) < count:
        raise ValueError(f"found {len(bases)} of {count} free port ranges of {consecutive} after {tries} candidates")
    return bases


# What a process prints when a port it was told to listen on is taken: the connector's side channel
# (connector/transfer/sidechannel/server.py), uvicorn and Python's socket errors, ZMQ's.
_PORT_TAKEN = ("address already in use", "cannot bind the side channel", "[errno 98]", "eaddrinuse")


def start_failed_on_port(log_tail: str) -> bool:
    """Whether an engine that exited while starting failed because a port it was given was taken."""
    text = log_tail.lower()
    return any(marker in text for marker in _PORT_TAKEN)
