"""The router's configuration: one frozen object that renders its own argv and parses it back.

The operator's plan builds a ``RouterConfig`` and renders the router container's args with
``to_argv``; ``pdfleet router`` parses them with ``add_arguments`` + ``from_args`` (the same
table of flags), so ``parse_argv(cfg.to_argv()) == cfg`` for every config the command line can
express (tests/unit/contract).

Endpoints come either from ``prefill``/``decode`` (static base URLs, one revision named
``static``) or from Kubernetes EndpointSlices when ``kubernetes_fleet`` is set; the revision
that serves is then the one the operator labels ``pdfleet.io/serving`` (see serving/endpoints.py).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Mapping, Sequence

from pdfleet.contract import env as env_names
from pdfleet.contract import kv_tiers
from pdfleet.contract import scale_to_zero as stz
from pdfleet.contract.flow_control import FLAG as FLOW_CONTROL_FLAG
from pdfleet.contract.flow_control import FlowControlConfig
from pdfleet.contract.ports import HTTP_NAME, KV_EVENTS, KV_EVENTS_REPLAY, ROUTER_HTTP
from pdfleet.contract.routing import (
    DEFAULT_HASH_SEED,
    DISAGGREGATION_ALWAYS,
    DISAGGREGATION_POLICIES,
    POLICIES,
    PREFIX_AWARE,
    PREFIX_HASH_ALGO,
)


# decode_reuse_min_tokens of a router that never asks decodes to hold a turn's KV (the default)
DECODE_REUSE_OFF = -1


@dataclass(frozen=True)
class RouterConfig:
    """Settings of one router process."""

    host: str = "127.0.0.1"  # in a pod: 0.0.0.0 or the pod IP
    port: int = ROUTER_HTTP

    prefill: tuple[str, ...] = ()
    decode: tuple[str, ...] = ()

    # Kubernetes discovery (used when kubernetes_fleet is set)
    kubernetes_fleet: str | None = None
    kubernetes_namespace: str = "default"
    kubeconfig: str | None = None  # None: in-cluster service account, else this kubeconfig file
    api_server: str | None = None  # overrides the server URL (tests, proxies)
    kubernetes_fleet_uid: str | None = None  # the fleet's uid: its Services' owner reference must carry it
    port_name: str = HTTP_NAME  # EndpointSlice port that serves the OpenAI API

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
    prefill_policy: str = PREFIX_AWARE
    decode_policy: str = PREFIX_AWARE
    kv_events: tuple[tuple[str, str], ...] = ()  # static: (engine URL, "PUB[,REPLAY]" ZMQ endpoints)
    tokenizer: str | None = None  # the served model's tokenizer (name or path); None: routed index only
    block_size: int = 16  # the engines' --block-size
    hash_algo: str = PREFIX_HASH_ALGO  # the engines' --prefix-caching-hash-algo
    hash_seed: str = DEFAULT_HASH_SEED  # the engines' PYTHONHASHSEED, else vLLM's default seed
    prefix_max_imbalance: int = 4  # in-flight requests above the least loaded a cached prefix may cost
    # spec.router.prefixScoring.tierWeights: a cached block's worth by the best KV tier holding it (kv_tiers.py)
    prefix_tier_weights: tuple[tuple[str, float], ...] = kv_tiers.DEFAULT_TIER_WEIGHTS
    kv_events_max_message_bytes: int = 8 * 1024 * 1024
    kv_index_max_blocks: int = 1_000_000  # per endpoint and tier (medium)
    # The router's KV-event memory across all publishers: half ZMQ queues, half block indexes
    # (connector/serving/kvaware/kv_subscriber.py: plan_budget).
    kv_events_max_total_bytes: int = 512 * 1024 * 1024
    prompt_cache_max_bytes: int = 32 * 1024 * 1024  # prompt_tokens.PromptTokenCache, in bytes (LRU)

    # spec.router.disaggregation (connector/serving/disaggregation.py): remote prefill per request or always
    disaggregation_policy: str = DISAGGREGATION_ALWAYS
    min_remote_prefill_tokens: int = 128  # Conditional: fewer uncached prompt tokens are computed on decode
    prefill_busy_in_flight: int = 4  # Conditional: prefills this loaded (and decode less) -> decode alone
    # spec.kvTransfer.decodeReuse (issue 40; serving/turn_reuse.py): the next turn's prefill pulls what the last
    # turn left on its decode when at least this many tokens are reusable; DECODE_REUSE_OFF: off
    decode_reuse_min_tokens: int = DECODE_REUSE_OFF

    # spec.router.flowControl (flow/): disabled, no gate and no queue; rendered as one --flow-control JSON
    flow_control: FlowControlConfig = field(default_factory=FlowControlConfig)

    # spec.scaling.scaleToZero (issue 41; serving/waiting_room.py): requests held while no pair is ready,
    # at most this many (0: the waiting room off, 503 at once) and this many body bytes, each this long
    scale_to_zero_max_waiting: int = 0
    scale_to_zero_activation_timeout_s: float = stz.DEFAULT_ACTIVATION_TIMEOUT_S
    scale_to_zero_max_waiting_bytes: int = stz.DEFAULT_MAX_WAITING_BYTES

    # request headers passed on to both legs
    forward_headers: tuple[str, ...] = field(
        default=("authorization", "traceparent", "tracestate", "baggage")
    )

    @property
    def decode_reuse(self) -> bool:
        return self.decode_reuse_min_tokens != DECODE_REUSE_OFF

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
        if not 0 <= self.port <= 65535:
            problems.append(f"port: must be in [0, 65535], got {self.port}")
        if self.max_body_bytes < 1:
            problems.append("max_body_bytes: must be >= 1")
        if self.prefill_attempts < 1 or self.decode_attempts < 1:
            problems.append("prefill_attempts/decode_attempts: must be >= 1")
        for name in ("connect_timeout_s", "prefill_timeout_s", "decode_first_byte_timeout_s",
                     "decode_idle_timeout_s", "models_timeout_s"):
            if getattr(self, name) <= 0:
                problems.append(f"{name}: must be > 0")
        for name in ("prefill_policy", "decode_policy"):
            if getattr(self, name) not in POLICIES:
                problems.append(f"{name}: must be one of {', '.join(POLICIES)}, got {getattr(self, name)!r}")
        for url, endpoints in self.kv_events:
            if not endpoints or not all(e.startswith(("tcp://", "ipc://")) for e in endpoints.split(",")):
                problems.append(f"kv_events: {url!r}: give PUB[,REPLAY] as tcp:// or ipc:// endpoints")
        if self.hash_algo != PREFIX_HASH_ALGO:
            problems.append(f"hash_algo: the router reproduces {PREFIX_HASH_ALGO} only, got {self.hash_algo!r}")
        if self.prompt_cache_max_bytes < 1024:
            problems.append(f"prompt_cache_max_bytes: must be >= 1024, got {self.prompt_cache_max_bytes}")
        if self.kv_events_max_total_bytes < 16 * 1024 * 1024:
            problems.append(f"kv_events_max_total_bytes: must be >= 16 MiB (16777216), got {self.kv_events_max_total_bytes}")
        if self.disaggregation_policy not in DISAGGREGATION_POLICIES:
            problems.append(f"disaggregation_policy: must be one of {', '.join(DISAGGREGATION_POLICIES)}, "
                            f"got {self.disaggregation_policy!r}")
        if not 0 <= self.min_remote_prefill_tokens <= 1_000_000:
            problems.append(f"min_remote_prefill_tokens: must be 0..1000000, got {self.min_remote_prefill_tokens}")
        if not DECODE_REUSE_OFF <= self.decode_reuse_min_tokens <= 1_000_000:
            problems.append(f"decode_reuse_min_tokens: must be {DECODE_REUSE_OFF} (off) or 0..1000000, got "
                            f"{self.decode_reuse_min_tokens}")
        if not 1 <= self.prefill_busy_in_flight <= 100_000:
            problems.append(f"prefill_busy_in_flight: must be 1..100000, got {self.prefill_busy_in_flight}")
        problems += [f"prefix_tier_weights: {p}" for p in kv_tiers.check(dict(self.prefix_tier_weights))]
        if self.block_size < 1 or self.prefix_max_imbalance < 0 or self.kv_index_max_blocks < 1:
            problems.append("block_size/kv_index_max_blocks: must be >= 1; prefix_max_imbalance: >= 0")
        if not 0 <= self.scale_to_zero_max_waiting <= 1_000_000:
            problems.append(f"scale_to_zero_max_waiting: must be 0..1000000, got {self.scale_to_zero_max_waiting}")
        if not 0 < self.scale_to_zero_activation_timeout_s <= 3600:
            problems.append("scale_to_zero_activation_timeout_s: must be in (0, 3600], got "
                            f"{self.scale_to_zero_activation_timeout_s}")
        if self.scale_to_zero_max_waiting_bytes < 1:
            problems.append(f"scale_to_zero_max_waiting_bytes: must be >= 1, got {self.scale_to_zero_max_waiting_bytes}")
        if problems:
            raise ValueError("invalid RouterConfig: " + "; ".join(problems))

    def to_argv(self) -> list[str]:
        """The command-line flags that make ``from_args`` build this config again.

        Fields in ``ALWAYS_RENDERED`` always appear (a pod's args say what it runs, whatever the
        router's defaults); the rest only when they differ from the default. A field the command
        line cannot set must be at its default."""
        defaults = RouterConfig.__dataclass_fields__
        fixed = [f.name for f in fields(self) if f.name in NOT_FLAGS and getattr(self, f.name) != _default(f)]
        # (the namespace is rendered with the fleet: a pod's POD_NAMESPACE must not change it)
        if fixed:
            raise ValueError(f"RouterConfig fields {fixed} cannot be set from the command line")
        argv: list[str] = []
        for name in _ORDER:
            value = getattr(self, name)
            wanted = name in ALWAYS_RENDERED or (name == "kubernetes_namespace" and self.kubernetes_fleet)
            if not wanted and value == _default(defaults[name]):
                continue
            if name == "kubernetes_fleet":
                argv += ["--kubernetes", "--fleet", value]
            elif name in ("prefill", "decode"):
                for url in value:
                    argv += [_flag(name), url]
            elif name == "kv_events":
                for url, endpoints in value:
                    argv += ["--kv-events", f"{url}={endpoints}"]
            elif name == "prefix_tier_weights":
                argv += [kv_tiers.FLAG, kv_tiers.render(value)]
            else:
                argv += [_flag(name), str(value)]
        if self.flow_control.enabled:  # disabled: nothing, so that such fleets keep their router pod template
            argv += [FLOW_CONTROL_FLAG, self.flow_control.to_arg()]
        return argv


# The plan's router args always carry these (see to_argv).
ALWAYS_RENDERED = frozenset({"host", "port", "prefill_policy", "decode_policy", "block_size", "hash_seed"})
# Fields without a flag: only tests and embedders (pdfleet local) set them.
NOT_FLAGS = frozenset({"api_server", "models_timeout_s", "hash_algo", "kv_events_max_message_bytes",
                       "kv_index_max_blocks", "forward_headers"})
# Flags that say how much and how long: (field, help).
_LIMITS = (
    ("max_body_bytes", "largest request body; bigger gets 413"),
    ("prefill_attempts", "prefill endpoints tried before decode serves alone"),
    ("decode_attempts", "decode endpoints tried before 502"),
    ("lease_margin_s", "reuse prefill's KV on a decode retry only with this much lease left"),
    ("connect_timeout_s", "TCP connect timeout per leg"),
    ("prefill_timeout_s", "whole prefill leg"),
    ("decode_first_byte_timeout_s", "until decode's response headers"),
    ("decode_idle_timeout_s", "between two chunks of decode's response"),
    ("eject_s", "how long a failed endpoint is avoided"),
    ("upstream_keepalive_s", "idle upstream connections closed after this (below the engines' own)"),
    ("scale_to_zero_max_waiting", "requests held while no prefill/decode pair is ready (spec.scaling.scaleToZero."
                                  "maxWaiting); 0: the waiting room off, 503 at once"),
    ("scale_to_zero_activation_timeout_s", "how long a request is held for a pair (activationTimeoutSeconds)"),
    ("scale_to_zero_max_waiting_bytes", "request body bytes held at once in the waiting room"),
    ("decode_reuse_min_tokens", "the next turn's prefill pulls what the last turn left on its decode when at least "
                                f"this many tokens are reusable (spec.kvTransfer.decodeReuse); {DECODE_REUSE_OFF}: off"),
)
_ORDER = ("host", "port", "kubernetes_fleet", "kubernetes_fleet_uid", "kubernetes_namespace", "kubeconfig",
          "port_name", "prefill", "decode", "prefill_policy", "decode_policy", "kv_events", "tokenizer", "block_size",
          "hash_seed", "prefix_max_imbalance", "prefix_tier_weights", "prompt_cache_max_bytes", "kv_events_max_total_bytes",
          "disaggregation_policy", "min_remote_prefill_tokens", "prefill_busy_in_flight",
          *(name for name, _ in _LIMITS))


def _default(f: Any) -> Any:
    return f.default if f.default is not MISSING else f.default_factory()


def _flag(name: str) -> str:
    return {"kubernetes_namespace": "--namespace", "kubernetes_fleet": "--fleet", "kubernetes_fleet_uid": "--fleet-uid"}.get(
        name, "--" + name.replace("_", "-"))


def add_arguments(parser: argparse.ArgumentParser, env: Mapping[str, str] | None = None) -> None:
    """Every RouterConfig flag; ``env`` (default os.environ) gives --fleet and --namespace defaults."""
    env = os.environ if env is None else env
    d = RouterConfig.__dataclass_fields__
    parser.add_argument("--host", default=d["host"].default,
                        help="address to listen on (in a pod: the pod IP or 0.0.0.0); default %(default)s")
    parser.add_argument("--port", type=int, default=d["port"].default, help="port to listen on; default %(default)s")
    src = parser.add_argument_group("endpoints: static lists, or the fleet's EndpointSlices")
    src.add_argument("--prefill", action="append", default=[], metavar="URL",
                     help="prefill engine base URL, e.g. http://10.0.0.7:8000 (repeat for several)")
    src.add_argument("--decode", action="append", default=[], metavar="URL", help="decode engine base URL (repeat)")
    src.add_argument("--kubernetes", action="store_true",
                     help="take endpoints from the fleet's EndpointSlices instead of --prefill/--decode")
    src.add_argument("--fleet", default=env.get(env_names.FLEET), metavar="NAME",
                     help=f"with --kubernetes: the fleet (CR name) (env {env_names.FLEET})")
    src.add_argument("--namespace", default=env.get(env_names.POD_NAMESPACE, d["kubernetes_namespace"].default),
                     help=f"namespace of the fleet (env {env_names.POD_NAMESPACE}); default %(default)s")
    src.add_argument("--fleet-uid", default=env.get(env_names.FLEET_UID) or None, metavar="UID",
                     help="with --kubernetes: the fleet's uid; only Services whose owner reference carries it "
                          f"are the fleet's (env {env_names.FLEET_UID}; the operator sets it)")
    src.add_argument("--kubeconfig", default=None,
                     help="kubeconfig file; default: in-cluster service account, else KUBECONFIG")
    src.add_argument("--port-name", default=d["port_name"].default,
                     help="EndpointSlice port serving the OpenAI API; default %(default)s")
    # Routers before the contract took the serving revision from --revision; the operator now labels
    # it on the EndpointSlices. Accepted and ignored, so an older plan's args still start a router.
    src.add_argument("--revision", default=None, help=argparse.SUPPRESS)
    kv = parser.add_argument_group("KV-cache-aware routing")
    for name in ("prefill_policy", "decode_policy"):
        kv.add_argument(_flag(name), default=d[name].default, choices=list(POLICIES), help="default %(default)s")
    kv.add_argument("--kv-events", action="append", default=[], metavar="URL=PUB[,REPLAY]",
                    help="static endpoints: an engine's KV event ZMQ endpoints, e.g. "
                         f"http://10.0.0.7:8000=tcp://10.0.0.7:{KV_EVENTS},tcp://10.0.0.7:{KV_EVENTS_REPLAY} (repeat); "
                         "with --kubernetes they come from the EndpointSlices' kv-events ports")
    kv.add_argument("--tokenizer", default=None, help="the served model's tokenizer (name or path), "
                    "to hash prompts as the engines do; without it the router uses what it routed itself")
    kv.add_argument("--block-size", type=int, default=d["block_size"].default, help="the engines' --block-size")
    kv.add_argument("--hash-seed", default=d["hash_seed"].default,
                    help="the engines' PYTHONHASHSEED, if set; default vLLM's %(default)s")
    kv.add_argument("--prompt-cache-max-bytes", type=int, default=d["prompt_cache_max_bytes"].default,
                    help="memory for prompt prefixes already tokenized (LRU), in bytes; default %(default)s")
    kv.add_argument("--kv-events-max-total-bytes", type=int, default=d["kv_events_max_total_bytes"].default,
                    help="the router's memory for KV events across all engines (queues and block indexes), in "
                         "bytes; default %(default)s")
    kv.add_argument("--prefix-max-imbalance", type=int, default=d["prefix_max_imbalance"].default,
                    help="requests in flight above the least loaded a cached prefix may cost; default %(default)s")
    kv.add_argument(kv_tiers.FLAG, default=kv_tiers.render(d["prefix_tier_weights"].default), metavar="WEIGHTS",
                    help="a cached block's worth by the best KV tier holding it, each in [0, 1] (0: that tier "
                         "is not indexed); default %(default)s")
    dis = parser.add_argument_group("disaggregation: remote prefill per request (serving/disaggregation.py)")
    dis.add_argument("--disaggregation-policy", default=d["disaggregation_policy"].default,
                     choices=list(DISAGGREGATION_POLICIES),
                     help="Always: every request prefill -> decode; Conditional: decode alone when a remote "
                          "prefill does not pay; default %(default)s")
    dis.add_argument("--min-remote-prefill-tokens", type=int, default=d["min_remote_prefill_tokens"].default,
                     help="Conditional: prompts with fewer tokens not cached on decode are computed on decode; "
                          "default %(default)s")
    dis.add_argument("--prefill-busy-in-flight", type=int, default=d["prefill_busy_in_flight"].default,
                     help="Conditional: when every prefill has this many legs in flight and decode fewer, decode "
                          "computes the prompt; default %(default)s")
    lim = parser.add_argument_group("limits and timeouts")
    for name, help_text in _LIMITS:
        lim.add_argument(_flag(name), type=type(d[name].default), default=d[name].default,
                         help=f"{help_text}; default %(default)s")
    flow = parser.add_argument_group("flow control (flow/): queue, priorities, per-tenant fairness, shedding")
    flow.add_argument(FLOW_CONTROL_FLAG, default=None, metavar="JSON",
                      help='e.g. {"enabled":true,"priorities":[{"name":"interactive","weight":8},'
                           '{"name":"batch","weight":1}]} (keys of spec.router.flowControl); default: disabled')


def from_args(args: argparse.Namespace) -> RouterConfig:
    """The config the parsed flags say; ``ValueError`` naming the flag or field when they are wrong."""
    if args.kubernetes and not args.fleet:
        raise ValueError(f"--kubernetes needs --fleet NAME (or env {env_names.FLEET})")
    if args.kubernetes and (args.prefill or args.decode):
        raise ValueError("--kubernetes and --prefill/--decode exclude each other")
    kv_events = []
    for item in args.kv_events:
        url, sep, endpoints = item.partition("=")
        if not sep:
            raise ValueError(f"--kv-events {item!r}: expected URL=PUB[,REPLAY]")
        kv_events.append((url, endpoints))
    scalars = {name: getattr(args, name) for name in (
        "host", "port", "kubeconfig", "port_name", "prefill_policy", "decode_policy", "tokenizer", "block_size",
        "hash_seed", "prefix_max_imbalance", "prompt_cache_max_bytes", "kv_events_max_total_bytes",
        "disaggregation_policy", "min_remote_prefill_tokens", "prefill_busy_in_flight", *(n for n, _ in _LIMITS))}
    flow_control = FlowControlConfig.from_arg(args.flow_control) if args.flow_control else FlowControlConfig()
    scalars["prefix_tier_weights"] = kv_tiers.parse(args.prefix_tier_weights)
    return RouterConfig(
        prefill=tuple(args.prefill), decode=tuple(args.decode), kv_events=tuple(kv_events),
        kubernetes_fleet=args.fleet if args.kubernetes else None, kubernetes_namespace=args.namespace,
        kubernetes_fleet_uid=args.fleet_uid if args.kubernetes else None, flow_control=flow_control, **scalars,
    )


def parse_argv(argv: Sequence[str], env: Mapping[str, str] | None = None) -> RouterConfig:
    """``from_args`` over a fresh parser (``env``: {} for a result that depends on argv alone)."""
    parser = argparse.ArgumentParser(prog="pdfleet router", exit_on_error=False)
    add_arguments(parser, {} if env is None else env)
    return from_args(parser.parse_args(list(argv)))


__all__ = ["RouterConfig", "add_arguments", "from_args", "parse_argv", "ALWAYS_RENDERED", "NOT_FLAGS"]
