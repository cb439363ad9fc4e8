"""Port numbers and port names an engine or router pod exposes."""

from __future__ import annotations

ENGINE_HTTP = 8000  # vLLM's OpenAI server inside prefill and decode pods (spec.engine.port)
ROUTER_HTTP = 8000  # the router's listen port (spec.router.port)
SIDE_CHANNEL = 5600  # the connector's ZMQ handshake, TP rank 0; rank r listens on SIDE_CHANNEL + r
KV_EVENTS = 5557  # vLLM's KV cache events, ZMQ PUB
KV_EVENTS_REPLAY = 5558  # their replay ROUTER socket
KV_EVENTS_PORTS = (KV_EVENTS, KV_EVENTS_REPLAY)

# Port names: on containers and Services, and so on EndpointSlices, where the router reads them.
HTTP_NAME = "http"
SIDE_CHANNEL_NAME = "nixl-side"  # TP rank r > 0: nixl-side-r
KV_EVENTS_NAME = "kv-events"
KV_EVENTS_REPLAY_NAME = "kv-events-replay"
