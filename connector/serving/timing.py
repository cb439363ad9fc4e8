"""What users feel, per request, for the SLO planner: time to first token, inter-token
latency, legs waiting for an engine, streams in progress.

One `RequestTiming` per client request lives in a context variable set by the pipeline
(pipeline.py) in the task that serves the request, so the hooks are one line each and need
no extra arguments, and a request counts the same whichever front end served it: the
router's handler task runs the prefill leg, the decode leg and the relay itself; the
Endpoint Picker's stream task sees decode's answer go by. Without a current
request (tests calling the router's parts directly) every hook does nothing.

- TTFT: from the request (body read) to the first byte of decode's answer body that is
  relayed to the client (the first token, streamed or not).
- ITL: on streams, the gap between answer chunks divided by the server-sent events in the
  chunk (a chunk may carry several tokens when the network coalesced them).
- waiting: prefill legs sent and not answered, decode legs sent and without their first
  byte yet: work queued in (or on its way to) an engine.
- streams: decode legs between their first byte and their end: the decode work in progress.
- requests per revision and outcome (5xx or answered): the canary analysis' error rate.
"""

from __future__ import annotations

import contextvars
import time
from typing import Any, Optional

from pdfleet.contract.metrics import OUTCOME_5XX, OUTCOME_ANSWERED, OUTCOME_FALLBACK

_current: contextvars.ContextVar[Optional["RequestTiming"]] = contextvars.ContextVar("pdfleet_request_timing",
                                                                                      default=None)
_SSE_EVENT = b"data:"


class RequestTiming:
    __slots__ = ("metrics", "revision", "started", "last_chunk", "decode_streaming", "kv_path_failed", "decision_s")

    def __init__(self, metrics: Any) -> None:
        self.metrics = metrics
        self.revision: Optional[str] = None  # set once the request's pair is chosen (``serving``)
        self.started = time.perf_counter()
        self.last_chunk: Optional[float] = None
        self.decode_streaming = False
        self.kv_path_failed = False
        self.decision_s = 0.0  # choosing the pair and every pick, prefill's and decode's (``decision_time``)

    def _gauge(self, name: str, *labels: str) -> Any:
        return getattr(self.metrics, name).labels(*labels, self.revision)


def begin(metrics: Any) -> None:
    """Start timing the current request (called once per client request, in the task that serves it:
    the router's handler, the Endpoint Picker's ext_proc stream)."""
    _current.set(RequestTiming(metrics))


def serving(revision: str) -> None:
    """The request's pair is chosen: its series are this revision's, its TTFT counts from now."""
    t = _current.get()
    if t is not None:
        t.revision = revision
        t.started = time.perf_counter()


def decision_time(seconds: float) -> None:
    """Time spent deciding for the current request (the pair, the P/D decision, a pick)."""
    t = _current.get()
    if t is not None:
        t.decision_s += seconds


def current() -> Optional[RequestTiming]:
    return _current.get()


def leg_started(role: str) -> None:
    t = _current.get()
    if t is None or t.revision is None:
        return
    if role == "decode":
        t.decode_streaming = False
    t._gauge("legs_waiting", role).inc()


def first_byte() -> None:
    """Decode answered (its headers arrived): the leg stops waiting and starts streaming."""
    t = _current.get()
    if t is None or t.revision is None or t.decode_streaming:
        return
    t.decode_streaming = True
    t._gauge("legs_waiting", "decode").dec()
    t.metrics.streams.labels(t.revision).inc()


def leg_ended(role: str) -> None:
    t = _current.get()
    if t is None or t.revision is None:
        return
    if role == "decode" and t.decode_streaming:
        t.decode_streaming = False
        t.metrics.streams.labels(t.revision).dec()
    else:
        t._gauge("legs_waiting", role).dec()


def chunk(data: bytes) -> None:
    """A piece of decode's answer went to the client."""
    t = _current.get()
    if t is None or t.revision is None or not data:
        return
    now = time.perf_counter()
    if t.last_chunk is None:
        t.metrics.ttft.labels(t.revision).observe(now - t.started)
    else:
        events = max(1, data.count(_SSE_EVENT))
        gap = (now - t.last_chunk) / events
        itl = t.metrics.itl.labels(t.revision)
        for _ in range(min(events, 64)):
            itl.observe(gap)
    t.last_chunk = now


def kv_fallback() -> None:
    """The request goes to decode alone because its KV path failed (a failed prefill leg, a lease
    that ran out): the pair answers, but recomputes; the canary analysis counts it against the pair."""
    t = _current.get()
    if t is not None:
        t.kv_path_failed = True


def finished(status: int) -> None:
    """The request was answered (or given up) with this status: count it against its revision (a
    request refused before its pair was chosen counts against none)."""
    t = _current.get()
    if t is None or t.revision is None:
        return
    outcome = OUTCOME_5XX if status >= 500 else OUTCOME_FALLBACK if t.kv_path_failed else OUTCOME_ANSWERED
    t.metrics.revision_requests.labels(t.revision, outcome).inc()
