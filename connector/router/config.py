"""RouterConfig: every knob of the router in one frozen dataclass."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class RouterConfig:
    """Settings of one router process.

    Endpoints come either from ``prefill``/``decode`` (static base URLs, one
    revision named ``static``) or from Kubernetes EndpointSlices when
    ``kubernetes_fleet`` is set (see discovery.py).
    """

    prefill: tuple[str, ...] = ()
    decode: tuple[str, ...] = ()

    # Kubernetes discovery (used when kubernetes_fleet is set)
    kubernetes_fleet: str | None = None
    kubernetes_namespace: str = "default"
    kubeconfig: str | None = None  # None: in-cluster service account, else this kubeconfig file
    api_server: str | None = None  # overrides the server URL (tests, proxies)
    kubernetes_fleet_uid: str | None = None  # the fleet's uid: its Services' owner reference must carry it
    port_name: str = "http"  # EndpointSlice port that serves the OpenAI API
    revision: str | None = None  # the operator's active revision; None: newest serviceable

    # limits
    max_body_bytes: int = 4 * 1024 * 1024
    prefill_attempts: int = 2  # prefill endpoints tried before decode-only
    decode_attempts: int = 2  # decode endpoints tried before giving up
    lease_margin_s: float = 1.0  # reuse prefill's KV on a retry only if the lease has this much left

    # timeouts (seconds)
    connect_timeout_s: float = 3.0
    prefill_timeout_s: float = 120.0  # whole prefill leg
    decode_first_byte_timeout_s: float = 600.0  # until decode's response headers (non-streaming: whole generation)
    decode_idle_timeout_s: float = 120.0  # between two chunks of decode's response
    models_timeout_s: float = 10.0
    eject_s: float = 5.0  # an endpoint that failed is avoided this long
    # Idle upstream connections are closed before vLLM's own keep-alive (5 s,
    # VLLM_HTTP_TIMEOUT_KEEP_ALIVE) closes them, so that a POST never goes out
    # on a connection the engine is closing (it would count as a failed leg).
    upstream_keepalive_s: float = 4.0

    # KV-cache-aware routing (prefix_routing.py)
    prefill_policy: str = "prefixAware"  # prefixAware | leastOutstanding
    decode_policy: str = "prefixAware"
    kv_events: tuple[tuple[str, str], ...] = ()  # static: (engine URL, "PUB[,REPLAY]" ZMQ endpoints)
    tokenizer: str | None = None  # the served model's tokenizer (name or path); None: routed index only
    block_size: int = 16  # the engines' --block-size
    hash_algo: str = "sha256_cbor"  # the engines' --prefix-caching-hash-algo
    hash_seed: str = "vllm-none-hash"  # the engines' PYTHONHASHSEED, else vLLM's default seed
    prefix_max_imbalance: int = 4  # in-flight requests above the least loaded a cached prefix may cost
    kv_events_max_message_bytes: int = 8 * 1024 * 1024
    kv_index_max_blocks: int = 1_000_000  # per endpoint
    prompt_cache_max_bytes: int = 32 * 1024 * 1024  # prompt_tokens.PromptTokenCache, in bytes (LRU)

    # request headers passed on to both legs
    forward_headers: tuple[str, ...] = field(
        default=("authorization", "traceparent", "tracestate", "baggage")
    )

    def max_request_seconds(self) -> float:
        """The longest a request admitted now may keep an upstream busy: both legs' connects, the whole
        prefill leg and decode until its first byte (non-streaming: the whole generation). Grace periods
        and the rollout drain are derived from it (operator/plan/drain.py)."""
        return 2 * self.connect_timeout_s + self.prefill_timeout_s + self.decode_first_byte_timeout_s

    def __post_init__(self) -> None:
        problems = []
        if self.kubernetes_fleet is None and (not self.prefill or not self.decode):
            problems.append("prefill/decode: give at least one of each, or kubernetes_fleet")
        for name in ("prefill", "decode"):
            for url in getattr(self, name):
                if not (url.startswith("http://") or url.startswith("https://")):
                    problems.append(f"{name}: {url!r} must start with http:// or https://")
        if self.max_body_bytes < 1:
            problems.append("max_body_bytes: must be >= 1")
        if self.prefill_attempts < 1 or self.decode_attempts < 1:
            problems.append("prefill_attempts/decode_attempts: must be >= 1")
        for name in ("connect_timeout_s", "prefill_timeout_s", "decode_first_byte_timeout_s",
                     "decode_idle_timeout_s", "models_timeout_s"):
            if getattr(self, name) <= 0:
                problems.append(f"{name}: must be > 0")
        for name in ("prefill_policy", "decode_policy"):
            if getattr(self, name) not in ("prefixAware", "leastOutstanding"):
                problems.append(f"{name}: must be prefixAware or leastOutstanding, got {getattr(self, name)!r}")
        for url, endpoints in self.kv_events:
            if not endpoints or not all(e.startswith(("tcp://", "ipc://")) for e in endpoints.split(",")):
                problems.append(f"kv_events: {url!r}: give PUB[,REPLAY] as tcp:// or ipc:// endpoints")
        if self.hash_algo != "sha256_cbor":
            problems.append(f"hash_algo: the router reproduces sha256_cbor only, got {self.hash_algo!r}")
        if self.prompt_cache_max_bytes < 1024:
            problems.append(f"prompt_cache_max_bytes: must be >= 1024, got {self.prompt_cache_max_bytes}")
        if self.block_size < 1 or self.prefix_max_imbalance < 0 or self.kv_index_max_blocks < 1:
            problems.append("block_size/kv_index_max_blocks: must be >= 1; prefix_max_imbalance: >= 0")
        if problems:
            raise ValueError("invalid RouterConfig: " + "; ".join(problems))
