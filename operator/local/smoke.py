"""`pdfleet local --smoke`: a few requests through the router, and the KV transfer figures.

A smoke request passes when it answers 200 with text, was served by prefill and
decode (no `x-pdfleet-fallback` header), and streaming ends with [DONE]. After the
requests, decode's /metrics must show prompt tokens that came by KV transfer since they
were sent (the warm-up before the router line moved some too). ``run_smoke`` is the run
itself (I/O); the lines it prints and its verdict are pure.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Optional, Sequence

import aiohttp

from pdfleet.contract.routing import FALLBACK_HEADER
from pdfleet.operator.local.console import say
from pdfleet.operator.local.smoke_report import engine_figures, format_table
from pdfleet.operator.observability.metrics_text import lenient_samples, sample_text, total_by

# The whole smoke session (every request and /metrics page).
TIMEOUT_S = 300.0
TRANSFER_SOURCE_METRIC = "vllm:prompt_tokens_by_source_total"
# Metric families worth showing from the engines, besides the token sources.
CONNECTOR_METRIC_PREFIXES = ("vllm:pdfleet_", "pdfleet_", "vllm:nixl")

_LONG = " ".join(f"block {i} of the prefill cache moves to decode over the network." for i in range(12))


@dataclass(frozen=True)
class SmokeRequest:
    label: str
    path: str
    body: dict[str, Any]


@dataclass
class SmokeResult:
    label: str
    ok: bool
    text: str
    detail: str = ""


def smoke_requests(model: str, max_tokens: int = 16) -> list[SmokeRequest]:
    common = {"model": model, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    return [
        SmokeRequest("completion (short)", "/v1/completions", {**common, "prompt": "The river runs"}),
        SmokeRequest("completion (several blocks)", "/v1/completions", {**common, "prompt": _LONG}),
        SmokeRequest("chat", "/v1/chat/completions", {
            **common, "messages": [{"role": "user", "content": "Which engine holds the cache?"}],
        }),
        SmokeRequest("completion (streaming)", "/v1/completions", {
            **common, "prompt": "Prefill then decode, block by block", "stream": True,
        }),
    ]


def _text_of(payload: dict[str, Any]) -> str:
    choice = (payload.get("choices") or [{}])[0]
    if "text" in choice:
        return choice.get("text") or ""
    return ((choice.get("message") or choice.get("delta") or {}).get("content")) or ""


async def send(session: aiohttp.ClientSession, base_url: str, req: SmokeRequest) -> SmokeResult:
    try:
        async with session.post(base_url + req.path, json=req.body) as resp:
            fallback = resp.headers.get(FALLBACK_HEADER)
            if req.body.get("stream"):
                text, done = [], False
                async for raw in resp.content:
                    line = raw.decode().strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[len("data:"):].strip()
                    if data == "[DONE]":
                        done = True
                        continue
                    text.append(_text_of(json.loads(data)))
                body_text, problem = "".join(text), None if done else "stream ended without [DONE]"
            else:
                raw_body = await resp.read()
                try:
                    body_text, problem = _text_of(json.loads(raw_body)), None
                except ValueError:
                    body_text, problem = "", f"not JSON: {raw_body[:200]!r}"
            if resp.status != 200:
                problem = f"HTTP {resp.status}: {body_text or problem}"
            elif fallback:
                problem = f"served without P/D (x-pdfleet-fallback: {fallback})"
            elif not body_text:
                problem = problem or "empty output"
            return SmokeResult(req.label, problem is None, body_text, problem or "")
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return SmokeResult(req.label, False, "", f"{type(exc).__name__}: {exc}")


def parse_metric_lines(text: str, prefixes: Iterable[str]) -> list[tuple[str, float]]:
    """(sample with labels, value) for every sample whose name starts with a prefix; a line that
    does not parse is skipped."""
    prefixes = tuple(prefixes)
    return [(sample_text(s), s.value) for s in lenient_samples(text)[0] if s.name.startswith(prefixes)]


def tokens_by_source(metrics_text: str) -> dict[str, float]:
    """{source: tokens} from vLLM's prompt-token counter (summed over engines' labels)."""
    return total_by(lenient_samples(metrics_text)[0], TRANSFER_SOURCE_METRIC, "source")


def decode_transferred(engines: Iterable[tuple[str, str, Optional[str]]]) -> float:
    """Prompt tokens the decode engines received by KV transfer, from (name, role, /metrics text)."""
    return sum(tokens_by_source(text).get("external_kv_transfer", 0.0)
               for _, role, text in engines if role == "decode" and text)


async def fetch_metrics(session: aiohttp.ClientSession, url: str) -> Optional[str]:
    try:
        async with session.get(url + "/metrics") as resp:
            return await resp.text() if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


def format_transfer_stats(engines: list[tuple[str, str, Optional[str]]], router_metrics: Optional[str]) -> list[str]:
    """Lines for the report: token sources per engine, connector metrics, router counters."""
    lines = []
    for name, _role, text in engines:
        if text is None:
            lines.append(f"{name}: /metrics unavailable")
            continue
        sources = tokens_by_source(text)
        shown = ", ".join(f"{k}={int(v)}" for k, v in sorted(sources.items()))
        lines.append(f"{name} prompt tokens by source: {shown or '(none)'}")
        for sample, value in parse_metric_lines(text, CONNECTOR_METRIC_PREFIXES):
            if not sample.endswith("_created") and "_created{" not in sample:
                lines.append(f"{name} {sample} {value:g}")
    if router_metrics:
        for sample, value in parse_metric_lines(router_metrics, ("pdfleet_router_requests_total",
                                                                 "pdfleet_router_fallbacks_total",
                                                                 "pdfleet_router_retries_total")):
            lines.append(f"router {sample} {value:g}")
    return lines


def clip(text: str, n: int = 60) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def result_line(req: SmokeRequest, result: SmokeResult) -> str:
    """One request's line: its prompt (clipped), its output and whether it passed."""
    prompt = req.body.get("prompt") or req.body["messages"][-1]["content"]
    status = "ok" if result.ok else f"FAILED: {result.detail}"
    return f"P/D {result.label}: {clip(prompt)!r} -> {result.text!r} [{status}]"


def verdict(passed: int, total: int, transferred: float) -> tuple[bool, list[str]]:
    """Whether the smoke test passed (every request, and decode received prompt tokens by KV transfer
    while they were sent), with its closing lines."""
    ok = passed == total and transferred > 0
    lines = ["smoke: decode received no prompt tokens by KV transfer"] if transferred <= 0 else []
    lines.append(f"smoke: {passed}/{total} requests passed, {int(transferred)} prompt tokens moved by KV transfer"
                 f" -> {'PASS' if ok else 'FAIL'}")
    return ok, lines


async def run_smoke(router_url: str, engines: Sequence[tuple[str, str, str]], model: str, *,
                    metrics_raw: bool = False, stopped: Callable[[], bool] = lambda: False) -> bool:
    """Send the smoke requests through the router (until ``stopped()``), print each result, the KV
    transfer figures of ``engines`` ((name, role, URL)) and the verdict; whether it passed."""
    results = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=TIMEOUT_S)) as session:
        # The warm-up moved KV too: count what the smoke requests moved.
        moved_before = decode_transferred([(name, role, await fetch_metrics(session, url))
                                           for name, role, url in engines if role == "decode"])
        for req in smoke_requests(model):
            if stopped():
                break
            result = await send(session, router_url, req)
            results.append(result)
            say(result_line(req, result))
        pages = [(name, role, await fetch_metrics(session, url)) for name, role, url in engines]
        router_metrics = await fetch_metrics(session, router_url)
    say("KV transfer (the warm-up included):")
    for line in format_table([engine_figures(*page) for page in pages], router_metrics):
        say(f"  {line}")
    if metrics_raw:
        say("Metrics:")
        for line in format_transfer_stats(pages, router_metrics):
            say(f"  {line}")
    ok, lines = verdict(sum(r.ok for r in results), len(smoke_requests(model)),
                        decode_transferred(pages) - moved_before)
    for line in lines:
        say(line)
    return ok
