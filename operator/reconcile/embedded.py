"""Run the real kopf operator in its own thread and event loop (tests, the bench).

The API server (e.g. a kmock-based fake) keeps running in the caller's loop; the
operator talks to it over HTTP exactly as it would to a cluster.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Any, Iterable, Iterator, Optional

import kopf

from pdfleet.operator.reconcile.handlers import OperatorOptions, build_registry


class EmbeddedOperator:
    def __init__(self, options: OperatorOptions, *, namespaces: Iterable[str] = (), clusterwide: bool = False,
                 standalone: bool = True, peering_name: Optional[str] = None,
                 liveness_endpoint: Optional[str] = None):
        self.options = options
        self.namespaces = list(namespaces)
        self.clusterwide = clusterwide or not self.namespaces
        self.standalone = standalone
        self.peering_name = peering_name
        self.liveness_endpoint = liveness_endpoint
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.error: Optional[BaseException] = None

    @property
    def runtime(self) -> dict[str, Any]:
        return self.options.runtime

    def _main(self) -> None:
        try:
            asyncio.run(kopf.operator(
                registry=build_registry(self.options),
                clusterwide=self.clusterwide,
                namespaces=[] if self.clusterwide else self.namespaces,
                standalone=None if self.peering_name else self.standalone,
                peering_name=self.peering_name,
                liveness_endpoint=self.liveness_endpoint,
                stop_flag=self._stop,
                ready_flag=self._ready,
            ))
        except BaseException as exc:  # surfaced to the test through .error
            self.error = exc

    def start(self, timeout: float = 20.0) -> "EmbeddedOperator":
        self._stop, self._ready, self.error = threading.Event(), threading.Event(), None  # restartable
        self._thread = threading.Thread(target=self._main, name="pdfleet-operator", daemon=True)
        self._thread.start()
        if not self._ready.wait(timeout):
            self.stop()
            raise TimeoutError(f"the operator did not start in {timeout}s: {self.error!r}")
        return self

    def stop(self, timeout: float = 20.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError("the operator thread did not stop")
        self._thread = None

    async def astart(self, timeout: float = 20.0) -> "EmbeddedOperator":
        """Start without blocking the caller's loop (which may be serving the API)."""
        await asyncio.get_running_loop().run_in_executor(None, self.start, timeout)
        return self

    async def astop(self, timeout: float = 20.0) -> None:
        await asyncio.get_running_loop().run_in_executor(None, self.stop, timeout)

    @contextlib.contextmanager
    def running(self) -> Iterator["EmbeddedOperator"]:
        self.start()
        try:
            yield self
        finally:
            self.stop()
