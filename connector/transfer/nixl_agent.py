"""Thin wrapper over a NIXL agent: registration, peers, READs, notifications.

Not thread-safe: each owner calls it from one thread (NIXL's own progress thread
runs underneath). ``nixl`` is imported lazily so pure modules import without it.
"""

from __future__ import annotations

import importlib
import logging
import sys
from typing import Any, Sequence

import numpy as np

from pdfleet.connector.transfer.layout import Span
from pdfleet.contract.connector_config import DEFAULTS as CONNECTOR_DEFAULTS

__all__ = ["NixlAgent", "NixlError"]

log = logging.getLogger(__name__)


class NixlError(RuntimeError):
    """A NIXL call failed (registration, peer metadata, posting or completing a transfer)."""


def _nixl_api() -> Any:
    """NIXL's python API module.

    ``import nixl`` picks the build (cu12/cu13) from torch's CUDA version and, with a
    CPU-only torch, ends up importing all of torch (seconds) to learn there is none.
    When torch is not loaded and its files name no CUDA version, pick the installed
    build the same way the meta package would (first of cu13, cu12), without torch.
    """
    if "nixl._api" in sys.modules or "torch" in sys.modules:
        return importlib.import_module("nixl._api")
    try:
        from nixl_meta_utils import _torch_cuda_version_from_disk

        cuda = _torch_cuda_version_from_disk()
    except ImportError:
        cuda = "unknown"
    if cuda is None:
        for name in ("nixl_cu13._api", "nixl_cu12._api"):
            try:
                return importlib.import_module(name)
            except ImportError:
                continue
    return importlib.import_module("nixl._api")


class NixlAgent:
    def __init__(self, name: str, backends: Sequence[str] = ("UCX",), progress_thread: bool = True,
                 nixl_threads: int = 0, nixl_split_batch: int = CONNECTOR_DEFAULTS.nixl_split_batch) -> None:
        try:
            api = _nixl_api()
        except ImportError as exc:  # pragma: no cover - depends on the image
            raise NixlError(f"NIXL is not installed: {exc}") from exc
        nixl_agent, nixl_agent_config = api.nixl_agent, api.nixl_agent_config
        backends = list(backends)
        if not backends:
            raise ValueError("backends must name at least one NIXL backend, e.g. ['UCX']")
        self.name = name
        # NIXL's progress thread polls without sleeping: it keeps one core busy per agent.
        if nixl_threads < 0 or nixl_split_batch < 1:
            raise ValueError(f"nixl_threads must be >= 0 and nixl_split_batch >= 1, got {nixl_threads} and"
                             f" {nixl_split_batch}")
        # nixl_threads > 0: UCX's thread-pool engine posts a transfer of at least `nixl_split_batch`
        # descriptors from that many threads at once, each with its own UCX worker. NIXL's own
        # threshold (1,024) would never split a KV pull; on a GPU each descriptor costs ~5 us to post.
        init = {"num_threads": str(nixl_threads), "split_batch_size": str(nixl_split_batch)} if nixl_threads else {}
        self._agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=progress_thread,
                                                         backends=[] if init else backends))
        for backend in backends if init else ():
            self._agent.create_backend(backend, init)
        missing = [b for b in backends if b not in self._agent.backends]
        if missing:
            raise NixlError(
                f"NIXL backends {missing} are not available (plugins: {self._agent.get_plugin_list()})"
            )
        self._registered: list[Any] = []
        self._prepped: list[Any] = []  # prepared descriptor lists not released yet

    def backend_options(self, backend: str = "UCX") -> dict[str, str]:
        """The parameters NIXL instantiated ``backend`` with (e.g. its thread count)."""
        return dict(self._agent.get_backend_params(backend))

    def register(self, spans: Sequence[Span]) -> None:
        """Register each span (a backing allocation, see ``registration_spans``), grouped by memory type."""
        by_mem: dict[str, list[tuple[int, int, int, str]]] = {}
        for r in spans:
            by_mem.setdefault(r.device, []).append((r.base, r.nbytes, r.device_id, ""))
        for mem, descs in by_mem.items():
            try:
                self._registered.append(self._agent.register_memory(descs, mem))
            except Exception as exc:
                raise NixlError(f"registering {len(descs)} {mem} allocation(s) failed: {exc}") from exc

    def metadata(self) -> bytes:
        return self._agent.get_agent_metadata()

    def add_peer(self, metadata: bytes) -> str:
        try:
            return self._agent.add_remote_agent(metadata)
        except Exception as exc:
            raise NixlError(f"loading peer agent metadata failed: {exc}") from exc

    def remove_peer(self, name: str) -> None:
        try:
            self._agent.remove_remote_agent(name)
        except Exception as exc:  # the peer may be gone already; nothing else to undo
            log.debug("remove_remote_agent(%s): %s", name, exc)

    def read(
        self,
        peer: str,
        local_mem: str,
        local: np.ndarray,
        remote_mem: str,
        remote: np.ndarray,
        notif: bytes,
    ) -> Any:
        """Create and post a READ of ``remote`` rows into ``local`` rows; returns the handle."""
        return self.post(peer, self.make_read_descs(peer, local_mem, local, remote_mem, remote, notif))

    def prep(self, peer: str | None, rows: np.ndarray, mem: str) -> Any:
        """Prepare a descriptor list once (``rows``: Nx5 strided rows; ``peer`` None: this agent's
        memory, the local side); release it with ``release_prepped``."""
        try:
            handle = self._agent.prep_xfer_dlist("NIXL_INIT_AGENT" if peer is None else peer, rows, mem)
        except Exception as exc:
            raise NixlError(f"preparing {len(rows)} {mem} descriptor row(s)"
                            f" {'locally' if peer is None else 'of ' + peer} failed: {exc}") from exc
        self._prepped.append(handle)
        return handle

    def release_prepped(self, handle: Any) -> None:
        if handle in self._prepped:
            self._prepped.remove(handle)
        try:
            self._agent.release_dlist_handle(handle)
        except Exception as exc:  # nothing else to undo
            log.debug("release_dlist_handle: %s", exc)

    def make_read(self, peer: str, local: Any, local_idx: np.ndarray, remote: Any, remote_idx: np.ndarray,
                  notif: bytes) -> Any:
        """Create (not post) a READ from prepared lists: paired int32 indices (see ``post``)."""
        try:
            return self._agent.make_prepped_xfer("READ", local, local_idx, remote, remote_idx, notif)
        except Exception as exc:
            raise NixlError(f"preparing READ from {peer} failed: {exc}") from exc

    def make_read_descs(self, peer: str, local_mem: str, local: np.ndarray, remote_mem: str, remote: np.ndarray,
                        notif: bytes) -> Any:
        """Create (not post) a READ from per-request Nx3 descriptor lists (see ``post``)."""
        try:
            ld = self._agent.get_xfer_descs(local, local_mem)
            rd = self._agent.get_xfer_descs(remote, remote_mem)
            return self._agent.initialize_xfer("READ", ld, rd, peer, notif)
        except Exception as exc:
            raise NixlError(f"preparing READ from {peer} failed: {exc}") from exc

    def post(self, peer: str, handle: Any) -> Any:
        """Post a created READ; returns the handle (released, and NixlError raised, if posting fails)."""
        try:
            state = self._agent.transfer(handle)
        except Exception as exc:
            self.release(handle)
            raise NixlError(f"posting READ from {peer} failed: {exc}") from exc
        if state == "ERR":
            self.release(handle)
            raise NixlError(f"posting READ from {peer} failed (state ERR)")
        return handle

    def state(self, handle: Any) -> str:
        """'DONE', 'PROC' or 'ERR'."""
        try:
            return self._agent.check_xfer_state(handle)
        except Exception as exc:
            log.warning("check_xfer_state: %s", exc)
            return "ERR"

    def release(self, handle: Any) -> bool:
        try:
            self._agent.release_xfer_handle(handle)
            return True
        except Exception as exc:  # still in flight and not cancellable: retried later
            log.debug("release_xfer_handle: %s", exc)
            return False

    def notifs(self) -> dict[str, list[bytes]]:
        return self._agent.get_new_notifs()

    def send_notif(self, peer: str, msg: bytes) -> None:
        self._agent.send_notif(peer, msg)

    def close(self) -> None:
        for handle in list(self._prepped):
            self.release_prepped(handle)
        for reg in self._registered:
            try:
                self._agent.deregister_memory(reg)
            except Exception as exc:
                log.debug("deregister_memory: %s", exc)
        self._registered.clear()
        self._agent = None  # type: ignore[assignment]
