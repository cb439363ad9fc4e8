"""Worker side of ``PdfleetConnector``: one ``KVSource`` (prefill) and/or ``KVSink`` (decode) per rank.

Runs in each vLLM worker. ``register_kv_caches`` turns the KV tensors into
transfer-core regions; each step ``start_load`` posts the pulls and holds the
scheduler asked for; ``transfer_results`` reports finished sends (released
leases), finished receives and failed receives (whose local blocks are also
reported as load errors, so vLLM recomputes them under
``kv_load_failure_policy=recompute`` or fails the request under ``fail``).

The test-only fault hooks live in ``connector/testhooks.py``; this edge only asks it for the
sink's NIXL agent and for what to call on a finished pull's blocks (None unless a test set one).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict, dataclass
from typing import Any, Mapping

import torch

from pdfleet.connector.adapter.config import AdapterConfig, key_ring
from pdfleet.connector.adapter.kv_layout import resolved_layout
from pdfleet.connector.adapter.regions import regions_for_layout
from pdfleet.connector.adapter.nodes import host_for_rank
from pdfleet.connector.adapter.scheduler import KeepAlive, PdfleetConnectorMetadata, PullSpec
from pdfleet.connector.adapter.stats import LAYOUT_KEY, counter_deltas
from pdfleet.connector.testhooks import after_pull_hook, sink_nixl_agent
from pdfleet.connector.transfer.layout import KVLayout, Region, Span
from pdfleet.contract.connector_counters import AdapterCounters

__all__ = ["WorkerSide", "compat_hash", "tensor_parallel_rank"]

log = logging.getLogger(__name__)

# At shutdown the prefill's side channel answers for up to this long (see KVSource.close);
# vLLM's executor waits 5 s for its workers before it signals them.
SOURCE_LINGER_SECONDS = 4.0


def tensor_parallel_rank() -> int:
    """This worker's TP rank (0 when vLLM's process groups are not set up, as in unit tests)."""
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return int(get_tensor_model_parallel_rank())
    except Exception:  # groups not initialised
        return 0


def compat_hash(fields: Mapping[str, Any]) -> str:
    """Hash of what must match for KV from one engine to be valid in another."""
    blob = json.dumps(dict(fields), sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


@dataclass
class _Inflight:
    remote_request_id: str
    local_block_ids: tuple[int, ...]
    started: float


class WorkerSide:
    def __init__(
        self,
        *,
        cfg: AdapterConfig,
        engine_id: str,
        kv_cache_config: Any,
        vllm_config: Any,
        is_producer: bool,
        is_consumer: bool,
    ) -> None:
        self.cfg = cfg
        self.engine_id = engine_id
        self.kv_cache_config = kv_cache_config
        self.vllm_config = vllm_config
        self.is_producer = is_producer
        self.is_consumer = is_consumer
        self.tp_size = vllm_config.parallel_config.tensor_parallel_size
        self.tp_rank = tensor_parallel_rank()
        self.source: Any = None
        self.sink: Any = None
        self.regions: list[Region] = []
        self.spans: list[Span] = []
        self.layout: KVLayout | None = None
        self.compat: str = ""
        self._kv_caches: dict[str, torch.Tensor] = {}
        self._inflight: dict[str, _Inflight] = {}  # decode request id -> pull
        self._by_remote: dict[str, str] = {}  # remote (prefill) request id -> decode request id
        self._immediate_failures: dict[str, str] = {}
        self._load_errors: set[int] = set()
        self._own = AdapterCounters()
        self._last_stats: dict[str, float] = {}
        self._after_pull = after_pull_hook()  # the end-to-end negative controls' corruption, None unless set

    # -- registration ---------------------------------------------------------
    def _layout(self, physical: str) -> KVLayout:
        spec = self.kv_cache_config.kv_cache_groups[0].kv_cache_spec
        is_mla = bool(getattr(self.vllm_config.model_config, "use_mla", False)) if self.vllm_config.model_config else False
        return KVLayout(
            block_size=int(spec.block_size),
            dtype=str(spec.dtype).removeprefix("torch."),
            # inside a block: heads outer to tokens ("HND") unless the layout says N before H
            layout="NHD" if physical.index("N") < physical.index("H") else "HND",
            num_kv_heads=int(spec.num_kv_heads),
            head_dim=int(spec.head_size),
            tp_rank=self.tp_rank,
            tp_size=self.tp_size,
            is_mla=is_mla,
            kv_cache_layout=physical,
        )

    def _compat_fields(self, layout: KVLayout) -> dict[str, Any]:
        import vllm

        mc = self.vllm_config.model_config
        cc = self.vllm_config.cache_config
        return {
            "pdfleet_wire": 1,
            "vllm": vllm.__version__,
            "model": getattr(mc, "model", None),
            "model_dtype": str(getattr(mc, "dtype", "")),
            "cache_dtype": str(getattr(cc, "cache_dtype", "")),
            "block_size": layout.block_size,
            "head_dim": layout.head_dim,
            "total_kv_heads": layout.num_kv_heads * (1 if layout.is_mla else layout.tp_size),
            "num_regions_per_rank": len(self.regions),
            "is_mla": layout.is_mla,
            "extra": self.cfg.settings.compat_extra,
        }

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from pdfleet.connector.transfer import KVSink, KVSource

        self._kv_caches = dict(kv_caches)
        physical = resolved_layout(self.vllm_config, self.kv_cache_config)
        self.regions, self.spans = regions_for_layout(kv_caches, self.kv_cache_config, physical)
        self.layout = self._layout(physical)
        # Heads are split across ranks, so ranks of different TP sizes agree on the total.
        self.compat = compat_hash(self._compat_fields(self.layout))
        ring = key_ring(self.cfg)  # one ring for source and sink: a rotation is seen by both
        if self.is_producer:
            self.source = KVSource(
                engine_id=self.engine_id,
                regions=self.regions,
                layout=self.layout,
                host=self.cfg.side_channel_host,
                port=self.cfg.side_channel_port,
                compat_hash=self.compat,
                secret=ring,
                settings=self.cfg.settings,
                backing=self.spans,
            )
            self.source.start()
        if self.is_consumer:
            self.sink = KVSink(
                engine_id=self.engine_id,
                regions=self.regions,
                layout=self.layout,
                compat_hash=self.compat,
                secret=ring,
                settings=self.cfg.settings,
                backing=self.spans,
                nixl_agent=sink_nixl_agent(),  # the fault suite's stuck READs, only with its variable set
            )
        log.info(
            "pdfleet connector rank %d/%d: KV cache layout %s, %d region(s) in %d registered allocation(s),"
            " producer=%s consumer=%s compat=%s",
            self.tp_rank, self.tp_size, physical, len(self.regions), len(self.spans),
            self.is_producer, self.is_consumer, self.compat,
        )

    # -- per step -------------------------------------------------------------
    def start_load(self, meta: Any) -> None:
        if not isinstance(meta, PdfleetConnectorMetadata):
            return
        self._own.params_rejected += meta.params_rejected
        hold_leases = getattr(meta, "hold_leases", {})
        for rid, ids in meta.holds.items():
            if self.source is None:
                log.warning("hold for %s ignored: this worker is not a KV producer", rid)
                continue
            try:
                self.source.hold(rid, list(ids), lease_id=hold_leases.get(rid))
            except Exception:  # never let one request take the engine down; the lease is lost
                log.exception("hold of %s failed", rid)
        local = getattr(meta, "local_releases", ())
        if local and self.source is not None:  # after the holds: a release may follow its hold in one step
            try:
                by_id = getattr(meta, "local_release_leases", {})
                self.source.release_unread(list(local), [by_id.get(r) for r in local])
            except Exception:  # best effort: the lease then runs its course
                log.exception("releasing %d unread lease(s) failed", len(local))
        kept = getattr(meta, "local_keep_alives", {})
        if kept and self.source is not None:  # after the releases: a hold released this step stays released
            try:
                self.source.keep_held(list(kept), list(kept.values()))
            except Exception:  # best effort: the hold then ends at its lease's end
                log.exception("keeping %d hold(s) alive failed", len(kept))
        for rid, spec in meta.pulls.items():
            self._start_pull(rid, spec)
        if self.sink is not None:
            for ka in meta.keep_alive:
                try:
                    self.sink.keep_alive(list(ka.remote_request_ids), host=self._host_of(ka), port=ka.port,
                                         remote_tp_size=ka.tp_size, lease_ids=list(ka.lease_ids) or None)
                except Exception:  # best effort: a lost heartbeat only shortens a lease
                    log.exception("keep_alive to %s:%d", ka.host, ka.port)
            for rel in getattr(meta, "releases", ()):
                try:
                    self.sink.release(list(rel.remote_request_ids), host=self._host_of(rel), port=rel.port,
                                      remote_tp_size=rel.tp_size, lease_ids=list(rel.lease_ids) or None)
                except Exception:  # best effort: a lost notice only means the lease runs out
                    log.exception("release to %s:%d", rel.host, rel.port)

    def _host_of(self, ka: KeepAlive) -> str:
        """The host of the prefill rank this rank talks to (prefill nodes may be different pods)."""
        if not ka.hosts or ka.tp_size <= 0 or self.tp_size % ka.tp_size:
            return ka.host  # the sink refuses a TP mismatch with its reason
        return host_for_rank(ka.hosts, self.tp_rank // (self.tp_size // ka.tp_size), ka.tp_size)

    def _start_pull(self, rid: str, spec: PullSpec) -> None:
        if spec.error is not None or spec.remote is None or self.sink is None:
            self._fail_now(rid, spec, spec.error or "this worker is not a KV consumer")
            return
        remote = spec.remote
        if remote.remote_request_id in self._by_remote:
            self._fail_now(rid, spec, f"remote request {remote.remote_request_id!r} is already being pulled")
            return
        k = self.tp_size // remote.tp_size
        remote_rank = self.tp_rank // k
        instance = None
        if remote.remote_instance_id is not None:
            instance = remote.remote_instance_id.split(",")[remote_rank]
        self._inflight[rid] = _Inflight(remote.remote_request_id, spec.local_block_ids, time.monotonic())
        self._by_remote[remote.remote_request_id] = rid
        try:
            self.sink.pull(
                remote.remote_request_id,
                host=host_for_rank(remote.hosts, remote_rank, remote.tp_size),
                port=remote.remote_port,
                remote_engine_id=remote.remote_engine_id,
                remote_instance_id=instance,
                remote_block_ids=list(spec.remote_block_ids),
                local_block_ids=list(spec.local_block_ids),
                remote_tp_size=remote.tp_size,
                # params <= 1.2: lets the core post the READs before the first lease ack arrives
                remote_lease_expiry=remote.remote_lease_expiry,
                # params >= 1.3: bounds heartbeat retries only (monotonic, shared with the scheduler)
                remote_lease_deadline=remote.lease_deadline,
                # params >= 1.4: named in every lease message; the READ waits for the source's grant of it
                lease_id=remote.remote_lease_id,
            )
        except Exception as exc:  # the core promises not to raise; never let it kill the engine
            log.exception("KV pull of %s raised", rid)
            self._inflight.pop(rid, None)
            self._by_remote.pop(remote.remote_request_id, None)
            self._fail_now(rid, spec, f"pull raised {type(exc).__name__}: {exc}")

    def _fail_now(self, rid: str, spec: PullSpec, reason: str) -> None:
        log.warning("KV pull of %s failed: %s", rid, reason)
        self._immediate_failures[rid] = reason
        self._own.failures += 1
        self._load_errors.update(spec.local_block_ids)

    def transfer_results(self) -> tuple[set[str], set[str], set[str]]:
        """(finished sending, finished receiving incl. failed, failed receiving)."""
        sending: set[str] = set()
        if self.source is not None:
            broken = self.source.healthy
            if broken:
                # Never silently dead: without its side channel this prefill's KV cannot be read, so the
                # engine must stop (vLLM's /health then fails and the pod is restarted).
                raise RuntimeError(f"pdfleet connector: {broken}")
            try:
                sending = set(self.source.poll_released())
            except Exception:
                log.exception("polling released leases failed")
        recving: set[str] = set()
        failed: set[str] = set(self._immediate_failures)
        self._immediate_failures = {}
        if self.sink is not None:
            try:
                done, fails = self.sink.poll()
            except Exception:
                log.exception("polling pulls failed")
                done, fails = [], {}
            for remote_id in done:
                rid = self._by_remote.pop(remote_id, None)
                inflight = self._inflight.pop(rid, None) if rid is not None else None
                if rid is None or inflight is None:
                    continue
                if self._after_pull is not None:
                    self._own.blocks_corrupted_for_test += self._after_pull(
                        self._kv_caches, self.kv_cache_config.num_blocks, inflight.local_block_ids)
                recving.add(rid)
            for remote_id, reason in fails.items():
                rid = self._by_remote.pop(remote_id, None)
                inflight = self._inflight.pop(rid, None) if rid is not None else None
                if rid is None or inflight is None:
                    log.warning("failure for unknown pull %s: %s", remote_id, reason)
                    continue
                log.warning("KV pull of %s failed, vLLM will recompute or fail it: %s", rid, reason)
                self._load_errors.update(inflight.local_block_ids)
                failed.add(rid)
        return sending, recving | failed, failed

    def take_load_errors(self) -> set[int]:
        out, self._load_errors = self._load_errors, set()
        return out

    # -- stats / lifecycle ----------------------------------------------------
    def cumulative_stats(self) -> dict[str, float]:
        out: dict[str, float] = asdict(self._own)
        for part in (self.source, self.sink):
            if part is None:
                continue
            for key, value in part.stats().items():
                out[key] = out.get(key, 0.0) + float(value)
        if self.sink is not None and self.layout is not None:
            out[LAYOUT_KEY + self.layout.kv_cache_layout] = out.get("transfers", 0.0)
        return out

    def stats_delta(self) -> dict[str, float]:
        now = self.cumulative_stats()
        delta = counter_deltas(now, self._last_stats)
        self._last_stats = now
        return delta

    @property
    def instance_id(self) -> str | None:
        return None if self.source is None else self.source.instance_id

    def close(self) -> None:
        for part in (self.sink, self.source):
            if part is not None:
                try:
                    if part is self.source:
                        part.close(linger=SOURCE_LINGER_SECONDS)  # answer the last acks of a drain
                    else:
                        part.close()
                except Exception:
                    log.exception("closing %s", type(part).__name__)
        self.sink = self.source = None
