"""Fixtures of the transfer-core tests; the helpers live in transfer_harness.py, a module
name of its own, so `from transfer_harness import ...` never picks up another conftest."""

from transfer_harness import *  # noqa: F401,F403  (pytest finds the fixtures here)
