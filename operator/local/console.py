"""Where `pdfleet local` speaks, and how it exits.

stdout carries only what a caller reads (the `router:` and `gateway:` lines, --smoke's results,
--preflight-only's verdict); progress and diagnostics go to stderr.
"""

from __future__ import annotations

import sys

EXIT_OK = 0
EXIT_FAILED = 1
# A serving run stopped by these signals ended as asked; any other stop (an engine out of restarts) failed.
REQUESTED_STOPS = ("SIGINT", "SIGTERM")


def err(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def say(message: str) -> None:
    print(message, flush=True)


def exit_code_after_stop(reason: str) -> int:
    """The exit code of a serving run that stopped for ``reason`` (a signal's name, or why it gave up)."""
    return EXIT_OK if reason in REQUESTED_STOPS else EXIT_FAILED


class StartupFailed(Exception):
    """The fleet cannot start; the message is the error line."""
