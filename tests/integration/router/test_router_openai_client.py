"""The official `openai` client against the real router in front of the fake engines.

What a user of the OpenAI API sends, and what the router counts for it: every
request served is one `requests_total{code="200"}`, a stream the client closes
right after `data: [DONE]` included; only a client that leaves before the end
is a 499 and a disconnect.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client.parser import text_string_to_metric_families

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.timeout(30)

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "hello there"}]


async def router_and_client(fleet, **decode_kw):
    p = await fleet.engine("p0", "prefill")
    d = await fleet.engine("d0", "decode", **decode_kw)
    url = await fleet.router([p], [d])
    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
    return p, d, url, client


async def counters(fleet, url) -> dict[tuple[str, frozenset], float]:
    async with fleet.session.get(url + "/metrics") as resp:
        text = await resp.text()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def requests(c, route: str, code: int) -> float:
    return c.get(("pdfleet_router_requests_total", frozenset({("route", route), ("code", str(code))})), 0.0)


def fallbacks(c, reason: str) -> float:
    return c.get(("pdfleet_router_fallbacks_total", frozenset({("reason", reason)})), 0.0)


def disconnects(c) -> float:
    return c[("pdfleet_router_client_disconnects_total", frozenset())]


async def counters_once_recorded(fleet, url, route: str) -> dict:
    """The router records a request when its handler ends, which may be after the client is done."""
    for _ in range(100):
        c = await counters(fleet, url)
        if sum(v for (name, labels), v in c.items()
               if name == "pdfleet_router_requests_total" and ("route", route) in labels):
            return c
        await asyncio.sleep(0.05)
    raise AssertionError(f"the router recorded no request on {route}")


# (id, route, arguments, served P/D?) — the requests of issue 14, as the openai client sends them
NON_STREAMING = [
    ("plain", COMPLETIONS, dict(prompt="hello there", max_tokens=7, temperature=0), True),
    ("n2", COMPLETIONS, dict(prompt="hello there", max_tokens=7, n=2), False),
    ("logprobs", COMPLETIONS, dict(prompt="hello there", max_tokens=7, logprobs=2), True),
    ("echo", COMPLETIONS, dict(prompt="hello there", max_tokens=7, echo=True), True),
    ("stop", COMPLETIONS, dict(prompt="hello there", max_tokens=7, stop=["\n", "."]), True),
    ("token_ids", COMPLETIONS, dict(prompt=[11, 12, 13], max_tokens=7), True),
    ("one_prompt_in_a_list", COMPLETIONS, dict(prompt=["hello there"], max_tokens=7), True),
    ("two_prompts", COMPLETIONS, dict(prompt=["hello there", "good night"], max_tokens=7), False),
    ("chat", CHAT, dict(messages=MESSAGES, max_completion_tokens=7), True),
    ("chat_n2", CHAT, dict(messages=MESSAGES, max_completion_tokens=7, n=2), False),
]


@pytest.mark.parametrize("route, args, pd", [c[1:] for c in NON_STREAMING], ids=[c[0] for c in NON_STREAMING])
async def test_non_streaming_requests_are_served_and_counted(fleet, route, args, pd):
    p, d, url, client = await router_and_client(fleet)
    api = client.chat.completions if route == CHAT else client.completions
    async with client:
        raw = await api.with_raw_response.create(model="tiny", **args)
        answer = raw.parse()

    prompt = args.get("prompt")
    prompts = len(prompt) if isinstance(prompt, list) and isinstance(prompt[0], str) else 1
    assert len(answer.choices) == prompts * args.get("n", 1)
    [dr] = d.received
    assert {k: dr.body[k] for k in args} == args  # every parameter reaches decode as sent
    if pd:
        [pr] = p.received
        assert pr.body["max_tokens"] == 1 and pr.body["kv_transfer_params"] == {"do_remote_decode": True}
        assert dr.body["kv_transfer_params"]["remote_engine_id"] == "p0"
        assert "x-pdfleet-fallback" not in raw.headers
    else:
        # vLLM would split it into several engine requests: decode alone serves it, said and counted
        assert p.received == []
        assert "kv_transfer_params" not in dr.body
        assert raw.headers["x-pdfleet-fallback"] == "decode-only"

    c = await counters_once_recorded(fleet, url, route)
    assert requests(c, route, 200) == 1
    assert requests(c, route, 499) == 0
    assert fallbacks(c, "fan_out") == (0 if pd else 1)
    assert fallbacks(c, "prefill_failed") == 0
    assert disconnects(c) == 0


@pytest.mark.parametrize("route", [COMPLETIONS, CHAT])
@pytest.mark.parametrize("include_usage", [False, True], ids=["no_usage", "usage"])
# eof_delay_s > 0: decode ends its body a while after [DONE] (as uvicorn does), so the
# client, which closes as soon as it reads [DONE], closes before the router is done
@pytest.mark.parametrize("eof_delay_s", [0.0, 1.0], ids=["router_ends_first", "client_closes_first"])
async def test_stream_that_reached_done_is_a_200(fleet, route, include_usage, eof_delay_s):
    p, d, url, client = await router_and_client(fleet, chunks=3, eof_delay_s=eof_delay_s)
    extra = {"stream_options": {"include_usage": True}} if include_usage else {}
    async with client:
        if route == CHAT:
            stream = await client.chat.completions.create(model="tiny", messages=MESSAGES, stream=True, **extra)
        else:
            stream = await client.completions.create(model="tiny", prompt="hello there", stream=True, **extra)
        chunks = [chunk async for chunk in stream]  # the client closes its response on [DONE]

    texts = [ch.choices[0].delta.content if route == CHAT else ch.choices[0].text for ch in chunks if ch.choices]
    assert texts == ["t0", "t1", "t2"]
    if include_usage:
        assert chunks[-1].choices == [] and chunks[-1].usage.total_tokens == 6
    else:
        assert all(ch.usage is None for ch in chunks)
    if eof_delay_s:
        # the race of issue 14 happened: the client's close cancelled the router, which dropped decode
        await asyncio.wait_for(d.cancelled.wait(), 5)
    c = await counters_once_recorded(fleet, url, route)
    assert requests(c, route, 200) == 1
    assert requests(c, route, 499) == 0
    assert disconnects(c) == 0
    assert len(p.received) == 1 and "kv_transfer_params" in d.received[0].body  # served P/D


@pytest.mark.parametrize("route", [COMPLETIONS, CHAT])
async def test_client_closing_mid_stream_is_a_499_and_cancels_decode(fleet, route):
    p, d, url, client = await router_and_client(fleet, chunks=3, gated=True)
    extra = {"stream_options": {"include_usage": True}}
    async with client:
        if route == CHAT:
            stream = await client.chat.completions.create(model="tiny", messages=MESSAGES, stream=True, **extra)
        else:
            stream = await client.completions.create(model="tiny", prompt="hello there", stream=True, **extra)
        first = await stream.__anext__()
        await stream.close()  # decode waits before its second chunk: the client leaves mid-stream
    assert (first.choices[0].delta.content if route == CHAT else first.choices[0].text) == "t0"

    await asyncio.wait_for(d.cancelled.wait(), 5)  # the router dropped the decode leg
    c = await counters_once_recorded(fleet, url, route)
    assert requests(c, route, 499) == 1
    assert requests(c, route, 200) == 0
    assert disconnects(c) == 1
    assert c[("pdfleet_router_in_flight", frozenset({("role", "decode"), ("endpoint", "decode-0")}))] == 0
