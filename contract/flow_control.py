"""Flow-control settings of one router (``spec.router.flowControl``), in one frozen dataclass.

The operator renders them as one JSON argument, ``--flow-control '{...}'`` (``to_arg``), and the
router parses that argument back (``from_arg``): the JSON keys below are the contract between the
two halves, spelled once here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# Gateway API Inference Extension conventions: the fairness id (tenant) and the objective (priority).
TENANT_HEADER = "x-gateway-inference-fairness-id"
PRIORITY_HEADER = "x-gateway-inference-objective"
DEFAULT_PRIORITY = "default"
# What tenants (and classes) share: the estimated cost of their requests (prompt tokens + max_tokens,
# serving/flow/cost.py), the default, or the number of requests (every request costs 1).
FAIRNESS_COST, FAIRNESS_REQUESTS = "cost", "requests"
FAIRNESS = (FAIRNESS_COST, FAIRNESS_REQUESTS)
FLAG = "--flow-control"
# RFC 9110 token characters: what a header name may be made of.
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]{1,128}$")
_MAX_PRIORITIES = 16
_KEYS = ("enabled", "maxQueueSeconds", "maxQueuedRequests", "maxInFlightPerDecode", "tenantHeader",
         "priorityHeader", "priorities", "fairness")


@dataclass(frozen=True)
class Priority:
    name: str
    weight: int = 1


@dataclass(frozen=True)
class FlowControlConfig:
    """``enabled=False`` (the default) leaves the router as before: no gate, no queue."""

    enabled: bool = False
    max_queue_s: float = 30.0  # a request queued this long is refused (429)
    max_queued: int = 1000  # requests waiting in the router at most
    # requests (first leg to last byte) in flight per ready decode endpoint of the serving revision
    max_in_flight_per_decode: int = 32
    tenant_header: str = TENANT_HEADER
    priority_header: str = PRIORITY_HEADER
    # empty: one class named "default"; see discipline.py for how weights rank and share
    priorities: tuple[Priority, ...] = field(default=())
    fairness: str = FAIRNESS_COST

    def __post_init__(self) -> None:
        problems = []
        if not (0 < self.max_queue_s <= 3600):
            problems.append(f"maxQueueSeconds: must be > 0 and <= 3600, got {self.max_queue_s!r}")
        if not (1 <= self.max_queued <= 1_000_000):
            problems.append(f"maxQueuedRequests: must be 1..1000000, got {self.max_queued!r}")
        if not (1 <= self.max_in_flight_per_decode <= 100_000):
            problems.append(f"maxInFlightPerDecode: must be 1..100000, got {self.max_in_flight_per_decode!r}")
        for name in ("tenant_header", "priority_header"):
            if not _HEADER_NAME.match(getattr(self, name)):
                problems.append(f"{_camel(name)}: {getattr(self, name)!r} is not an HTTP header name")
        if self.tenant_header.lower() == self.priority_header.lower():
            problems.append("tenantHeader/priorityHeader: must differ")
        names = [p.name for p in self.priorities]
        if len(names) > _MAX_PRIORITIES:
            problems.append(f"priorities: at most {_MAX_PRIORITIES}, got {len(names)}")
        if len(set(names)) != len(names):
            problems.append(f"priorities: names must be unique, got {names}")
        for i, p in enumerate(self.priorities):
            if not p.name or len(p.name) > 253:
                problems.append(f"priorities[{i}].name: 1..253 characters")
            if not (isinstance(p.weight, int) and 1 <= p.weight <= 1000):
                problems.append(f"priorities[{i}].weight: must be an integer 1..1000, got {p.weight!r}")
        if self.fairness not in FAIRNESS:
            problems.append(f"fairness: must be one of {', '.join(FAIRNESS)}, got {self.fairness!r}")
        if problems:
            raise ValueError("invalid flow control: " + "; ".join(problems))

    @property
    def classes(self) -> tuple[Priority, ...]:
        """The priority classes, highest first: by weight, then as listed."""
        listed = self.priorities or (Priority(DEFAULT_PRIORITY, 1),)
        order = sorted(range(len(listed)), key=lambda i: (-listed[i].weight, i))
        return tuple(listed[i] for i in order)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "enabled": self.enabled, "maxQueueSeconds": self.max_queue_s, "maxQueuedRequests": self.max_queued,
            "maxInFlightPerDecode": self.max_in_flight_per_decode, "tenantHeader": self.tenant_header,
            "priorityHeader": self.priority_header,
            "priorities": [{"name": p.name, "weight": p.weight} for p in self.priorities],
        }
        if self.fairness != FAIRNESS_COST:  # the default stays unsaid: rendered router args keep their shape
            out["fairness"] = self.fairness
        return out

    def to_arg(self) -> str:
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, data: Any) -> "FlowControlConfig":
        if not isinstance(data, dict):
            raise ValueError(f"flow control: expected a JSON object, got {type(data).__name__}")
        unknown = sorted(set(data) - set(_KEYS))
        if unknown:
            raise ValueError(f"flow control: unknown keys {unknown}; allowed: {', '.join(_KEYS)}")
        d = cls()
        prios = data.get("priorities", [])
        if not isinstance(prios, list) or not all(isinstance(p, dict) and set(p) <= {"name", "weight"}
                                                  for p in prios):
            raise ValueError("flow control: priorities must be a list of {name, weight}")
        return cls(
            enabled=_typed(data, "enabled", bool, d.enabled),
            max_queue_s=float(_typed(data, "maxQueueSeconds", (int, float), d.max_queue_s)),
            max_queued=_typed(data, "maxQueuedRequests", int, d.max_queued),
            max_in_flight_per_decode=_typed(data, "maxInFlightPerDecode", int, d.max_in_flight_per_decode),
            tenant_header=_typed(data, "tenantHeader", str, d.tenant_header),
            priority_header=_typed(data, "priorityHeader", str, d.priority_header),
            priorities=tuple(Priority(_typed(p, "name", str, ""), _typed(p, "weight", int, 1)) for p in prios),
            fairness=_typed(data, "fairness", str, d.fairness),
        )

    @classmethod
    def from_arg(cls, text: str) -> "FlowControlConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{FLAG}: not JSON: {exc}") from None
        return cls.from_json(data)


def _typed(data: dict[str, Any], key: str, kind: Any, default: Any) -> Any:
    value = data.get(key, default)
    if isinstance(value, bool) and kind is not bool and bool not in (kind if isinstance(kind, tuple) else (kind,)):
        raise ValueError(f"flow control: {key}: expected a number, got a boolean")
    if not isinstance(value, kind):
        raise ValueError(f"flow control: {key}: expected {getattr(kind, '__name__', 'a number')}, "
                         f"got {type(value).__name__}")
    return value


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(w.title() for w in rest)
