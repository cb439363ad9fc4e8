"""Fake OpenAI engines (real aiohttp servers on loopback) that record what they receive.

A prefill fake answers like vLLM's prefill with a kv_transfer_params of its own;
a decode fake echoes the kv_transfer_params it got and streams SSE chunks when
asked. ``mode`` switches failure behaviours.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from pdfleet.connector.serving.body_fields import lax_int
from pdfleet.contract.kv_params import (KEPT, REMOTE_REQUEST_ID, InvalidTransferParams, error_params, keep_alive_offers,
                                        keep_alive_reply, lease_id_of, own_held_offer, own_lease_to_release, produce,
                                        release_reply, wants_hold_for_next_turn, wants_keep_alive, wants_release,
                                        with_block_hashes)
from pdfleet.contract.ports import SIDE_CHANNEL


@dataclass
class Received:
    path: str
    headers: Any  # CIMultiDict: case-insensitive
    body: Any


@dataclass
class FakeEngine:
    name: str
    role: str  # "prefill" or "decode"
    mode: str = "ok"  # ok | http500 | http400 | hang | slow | no_kv | drop_midstream | short_body
    lease_s: float = 30.0
    chunks: int = 3
    # seconds between `data: [DONE]` and the end of the chunked body (uvicorn sends that end
    # separately; a client that closes on [DONE] then races the router)
    eof_delay_s: float = 0.0
    delay_s: float = 0.0  # answer every request this much later (a busy engine)
    answer_pad: int = 0  # prefill: this many more bytes in every answer (an engine whose answers are large)
    reuse_blocks: int = 8  # decode asked to hold a turn (issue 40): the blocks its offer names
    # decode: its holds for next turns, request id -> (lease id, until: monotonic), extended by keep-alives as its
    # connector does; keeps=False: it answers every keep-alive "no such hold" (it needed the memory)
    holds: dict[str, tuple[bytes, float]] = field(default_factory=dict)
    keeps: bool = True
    kept: list[str] = field(default_factory=list)  # the holds keep-alives extended, in order
    received: list[Received] = field(default_factory=list)
    # prefill: remote request ids of its own leases that release requests named (as its connector checks them)
    released: list[str] = field(default_factory=list)
    # streaming control: when set, the fake waits on `release` before each chunk after the first
    gated: bool = False
    release: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)
    url: str = ""
    _runner: web.AppRunner | None = None

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        app.router.add_get("/v1/models", self._models)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _models(self, request: web.Request) -> web.Response:
        self.received.append(Received(request.path, request.headers.copy(), None))
        return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": self.name}]})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(Received(request.path, request.headers.copy(), body))
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.mode == "http500":
                return web.json_response({"error": {"message": "boom"}}, status=500)
            if self.mode == "http400":
                return web.json_response({"error": {"message": f"bad prompt ({self.name})", "code": 400}}, status=400)
            if self.mode == "hang":
                await asyncio.sleep(3600)
            if self.mode == "slow":  # answers, but only after 0.8 s
                await asyncio.sleep(0.8)
            if self.role == "prefill" or wants_release(body.get("kv_transfer_params")):
                return self._prefill_answer(request, body)
            if wants_keep_alive(body.get("kv_transfer_params")):
                return self._keep_alive_answer(body)
            return await self._decode_answer(request, body)
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    def _prefill_answer(self, request: web.Request, body: dict) -> web.Response:
        answer: dict[str, Any] = {"id": "cmpl-p", "choices": [{"index": 0, "text": "x"}], "served_by": self.name}
        if wants_release(body.get("kv_transfer_params")):  # the router says no decode will read this lease
            try:
                self.released.append(own_lease_to_release(body["kv_transfer_params"], engine_id=self.name, verify=None))
                answer["kv_transfer_params"] = release_reply()
            except InvalidTransferParams as exc:
                answer["kv_transfer_params"] = error_params(str(exc))
            return web.json_response(answer)
        if body.get("prompt_logprobs"):  # as vLLM sizes it: prompt_logprobs entries per prompt token
            answer["prompt_logprobs"] = prompt_logprobs(body)
        if self.answer_pad:
            answer["pad"] = "x" * self.answer_pad
        if self.mode != "no_kv":
            # Through the connector's own producer: the router reads what pdfleet's engines write.
            answer["kv_transfer_params"] = produce(
                block_ids=[1, 2, 3], engine_id=self.name, request_id=request.headers.get("X-Request-Id") or "",
                host="127.0.0.1", port=SIDE_CHANNEL, tp_size=1, instance_id=None,
                lease_seconds=self.lease_s, num_tokens=48)
        return web.json_response(answer)

    def _keep_alive_answer(self, body: dict) -> web.Response:
        """As a kv_both decode's connector answers the router's keep-alive: one verdict per offer."""
        now, verdicts = time.monotonic(), []
        try:
            offers = keep_alive_offers(body["kv_transfer_params"])
        except InvalidTransferParams as exc:
            return web.json_response({"choices": [], "kv_transfer_params": error_params(str(exc))})
        for i, offer in enumerate(offers):
            try:
                rid, lease_id = own_held_offer(offer, engine_id=self.name, verify=None, index=i)
            except InvalidTransferParams as exc:
                verdicts.append(str(exc))
                continue
            held = self.holds.get(rid)
            if not self.keeps or held is None or held[0] != lease_id or held[1] <= now:
                verdicts.append("no such hold")
                continue
            self.holds[rid] = (lease_id, now + self.lease_s)
            self.kept.append(rid)
            verdicts.append(KEPT)
        return web.json_response({"choices": [], "kv_transfer_params": keep_alive_reply(verdicts)})

    async def _decode_answer(self, request: web.Request, body: dict) -> web.StreamResponse:
        kv = body.get("kv_transfer_params")
        if self.mode == "short_body":  # announces 100 bytes, sends 10, hangs up
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            resp.content_length = 100
            await resp.prepare(request)
            await resp.write(b'{"id": "cm')
            request.transport.close()
            return resp
        chat = request.path.endswith("/chat/completions")
        kind = "chat.completion" if chat else "text_completion"
        if not body.get("stream"):
            offer = None
            if wants_hold_for_next_turn(kv):  # as a kv_both decode answers: an offer for the next turn
                offer = with_block_hashes(produce(
                    block_ids=list(range(self.reuse_blocks)), engine_id=self.name,
                    request_id=request.headers.get("X-Request-Id") or "", host="127.0.0.1", port=SIDE_CHANNEL,
                    tp_size=1, instance_id=None, lease_seconds=self.lease_s, num_tokens=16 * self.reuse_blocks),
                    [bytes([i]) * 32 for i in range(self.reuse_blocks)])
                lease_id = lease_id_of(offer)
                assert lease_id is not None
                self.holds[offer[REMOTE_REQUEST_ID]] = (lease_id, time.monotonic() + self.lease_s)
            choices = [{"index": i, "finish_reason": "length",
                        **({"message": {"role": "assistant", "content": "hello world"}} if chat
                           else {"text": "hello world"})} for i in range(_choices(body))]
            return web.json_response({"id": "cmpl-d", "object": kind, "created": 0, "model": body.get("model"),
                                      "choices": choices, "usage": _USAGE,
                                      "served_by": self.name, "kv_seen": kv, "kv_transfer_params": offer})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        head = {"id": "cmpl-d", "object": kind + ".chunk" if chat else kind, "created": 0,
                "model": body.get("model")}
        for i in range(self.chunks):
            if i and self.gated:
                await self.release.wait()
                self.release.clear()
            if i and self.mode == "drop_midstream":
                request.transport.close()
                return resp
            choice = {"index": 0, **({"delta": {"content": f"t{i}"}} if chat else {"text": f"t{i}"})}
            event = dict(head, choices=[choice], served_by=self.name)
            await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        if (body.get("stream_options") or {}).get("include_usage"):  # vLLM: the last chunk, no choices
            await resp.write(b"data: " + json.dumps(dict(head, choices=[], usage=_USAGE)).encode() + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        if self.eof_delay_s:
            await asyncio.sleep(self.eof_delay_s)
        await resp.write_eof()
        return resp


_USAGE = {"prompt_tokens": 3, "completion_tokens": 3, "total_tokens": 6}


def prompt_logprobs(body: dict) -> list:
    """vLLM's prompt_logprobs in an answer: per prompt token (ids, or one per 4 characters of text), the
    top ``prompt_logprobs`` candidates (a 32k-token prompt at 20: about 48 MB of JSON, as vLLM's)."""
    prompt = body.get("prompt") or "".join(str(m.get("content")) for m in body.get("messages") or ())
    tokens = len(prompt) if isinstance(prompt, list) else -(-len(prompt) // 4)
    top = int(body["prompt_logprobs"])
    entry = {str(1000 + r): {"logprob": -1.2345678901234567, "rank": r + 1, "decoded_token": " token"}
             for r in range(top)}
    return [None] + [entry] * (tokens - 1)


def _choices(body: dict) -> int:
    """One choice per prompt and per sequence, as vLLM answers."""
    prompt = body.get("prompt")
    prompts = len(prompt) if isinstance(prompt, list) and not all(isinstance(t, int) for t in prompt) else 1
    return prompts * lax_int(body.get("n") or 1)  # "4" and 4.0 are 4 choices to vLLM
