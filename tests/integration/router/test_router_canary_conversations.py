"""The canary split on real traffic shapes (issue 31): a real router (real HTTP, EndpointSlice discovery
through kmock's API server) in front of fake engines of two revision pairs, the canary at weight 30.
600 multi-turn conversations, each behind the same 1,000-character system prompt, in chat form (the user
turns as content parts for a third of them) and in completions form (each turn's prompt is the previous
prompt + answer + the new user turn). Measured at the engines: the canary's decode gets 30 +- 5 % of the
requests, and at least 99 % of conversations have every turn on one pair (here: all of them).

Negative control: the same measures, applied to the key the router used before issue 31 (the first 512
characters) and to a per-request key, fail (all or nothing to the canary; conversations split)."""

from __future__ import annotations

import asyncio

import pytest
import test_router_discovery
from test_router_discovery import NS, apply, endpoint_slice, wait_health

from pdfleet.connector.serving.canary import to_canary
from pdfleet.contract import labels

pytestmark = pytest.mark.timeout(240)
kubeconfig = test_router_discovery.kubeconfig  # the fixture, for this module's tests
N = 600
SYSTEM = ("You are the support assistant of a hardware store. Answer briefly, cite the aisle, never invent "
          "prices, and ask a clarifying question when the customer's request is ambiguous. ") * 6
SYSTEM = SYSTEM[:1000]


def turns_of(i: int) -> int:
    return 2 + i % 3  # 2 to 4 turns


def chat_body(i: int, t: int) -> dict:
    messages = [{"role": "system", "content": SYSTEM}]
    for k in range(t + 1):
        text = f"Customer {i}, turn {k}: where are the {i * 7919 % 1000} mm screws?"
        messages.append({"role": "user", "content": [{"type": "text", "text": text}] if i % 3 == 0 else text})
        if k < t:
            messages.append({"role": "assistant", "content": f"Aisle {k} (customer {i})."})
    return {"model": "tiny", "messages": messages, "max_tokens": 3}


def completions_body(i: int, t: int) -> dict:
    prompt = SYSTEM + "\n\n"
    for k in range(t + 1):
        prompt += f"User: customer {i}, turn {k}: where is the {i * 31 % 997} paint?\nAssistant:"
        if k < t:
            prompt += f" Aisle {k} for customer {i}.\n"
    return {"model": "tiny", "prompt": prompt, "max_tokens": 3}


FORMS = {"chat": ("/v1/chat/completions", chat_body), "completions": ("/v1/completions", completions_body)}


def measure(pair_of_request: dict[tuple[int, int], str]) -> tuple[float, float]:
    """(canary share of requests in %, % of conversations whose turns all went to one pair)."""
    share = sum(p == "r2" for p in pair_of_request.values()) / len(pair_of_request) * 100
    pairs: dict[int, set[str]] = {}
    for (i, _t), p in pair_of_request.items():
        pairs.setdefault(i, set()).add(p)
    return share, sum(len(s) == 1 for s in pairs.values()) / len(pairs) * 100


def passes(share: float, sticky: float) -> bool:
    return abs(share - 30) <= 5 and sticky >= 99


async def converse(fleet, url: str, form: str, concurrency: int = 24) -> None:
    """Every conversation's turns in order (turn t after turn t-1's answer); conversations concurrent."""
    path, make = FORMS[form]
    queue = list(range(N))

    async def worker() -> None:
        while queue:
            i = queue.pop()
            for t in range(turns_of(i)):
                async with fleet.session.post(url + path, json=make(i, t),
                                              headers={"X-Request-Id": f"{form}-{i}-{t}"}) as r:
                    assert r.status == 200, await r.text()
                    await r.read()

    await asyncio.gather(*(worker() for _ in range(concurrency)))


def pairs_from_engines(decodes: dict[str, object], form: str) -> dict[tuple[int, int], str]:
    out = {}
    for revision, engine in decodes.items():
        for r in engine.received:
            f, i, t = r.headers["X-Request-Id"].rsplit("-", 2)
            if f == form:
                assert (int(i), int(t)) not in out, "one decode leg per request"
                out[(int(i), int(t))] = revision
    return out


@pytest.fixture
def api(kmock):
    kmock.resources.load_bundled()
    return kmock


async def test_conversations_behind_a_shared_prompt_split_by_weight_and_stay_on_one_pair(api, kubeconfig, fleet):
    pa, da = await fleet.engine("pA", "prefill"), await fleet.engine("dA", "decode")
    pb, db = await fleet.engine("pB", "prefill"), await fleet.engine("dB", "decode")
    await apply(fleet, api, endpoint_slice("p1", pa, "prefill", "r1", serving=True))
    await apply(fleet, api, endpoint_slice("d1", da, "decode", "r1", serving=True))
    for name, eng, role in (("p2", pb, "prefill"), ("d2", db, "decode")):
        obj = endpoint_slice(name, eng, role, "r2", created="2026-02-01T00:00:00Z")
        obj["metadata"]["labels"][labels.CANARY_WEIGHT] = "30"
        await apply(fleet, api, obj)
    url = await fleet.router([], [], kubernetes_fleet="f1", kubernetes_namespace=NS, kubeconfig=kubeconfig)
    await wait_health(fleet, url, lambda h: (h.get("canary") or {}).get("weight") == 30, "canary at 30%")

    for form in FORMS:
        await converse(fleet, url, form)
        got = pairs_from_engines({"r1": da, "r2": db}, form)
        assert len(got) == sum(turns_of(i) for i in range(N))
        share, sticky = measure(got)
        print(f"{form}: canary share {share:.1f} % of {len(got)} requests at weight 30; "
              f"{sticky:.1f} % of {N} conversations on one pair")
        assert passes(share, sticky), (form, share, sticky)
        # both legs of every request on one pair: the canary's prefill got exactly its decode's requests
        prefill_ids = {r.headers["X-Request-Id"] for r in pb.received if r.headers["X-Request-Id"].startswith(form)}
        assert prefill_ids == {f"{form}-{i}-{t}" for (i, t), p in got.items() if p == "r2"}


def old_key(body: dict) -> str:
    """The router's key before issue 31: the first 512 characters of system + first user turn / prompt."""
    if "messages" in body:
        parts = []
        for m in body["messages"]:
            if isinstance(m.get("content"), str):
                parts.append(f"{m['role']}:{m['content']}")
                if m["role"] == "user":
                    break
        return "\n".join(parts)[:512]
    return body["prompt"][:512]


@pytest.mark.parametrize("form", list(FORMS))
def test_negative_control_the_old_key_and_a_per_request_key_fail_the_same_measures(form) -> None:
    _, make = FORMS[form]
    requests = [(i, t) for i in range(N) for t in range(turns_of(i))]
    old = {(i, t): "r2" if to_canary(old_key(make(i, t)), "r2", 30) else "r1" for i, t in requests}
    share, sticky = measure(old)
    assert share in (0, 100) and not passes(share, sticky), (share, sticky)  # all or nothing
    per_request = {(i, t): "r2" if to_canary(f"{form}-{i}-{t}", "r2", 30) else "r1" for i, t in requests}
    share, sticky = measure(per_request)
    assert abs(share - 30) <= 5 and sticky < 90 and not passes(share, sticky), (share, sticky)
