"""A small PromQL evaluator over recorded scrapes (pure), enough for the dashboard's queries.

It walks promql-parser's AST and supports what the dashboard uses: selectors with label
matchers, `rate` / `increase` over a range, `sum` / `max` / `min` / `avg` / `count` by or
without labels, `histogram_quantile`, arithmetic and comparisons between vectors (matched on
all labels) and with scalars. Anything else raises NotImplementedError, so a query the
render cannot draw says so instead of drawing something wrong. Differences from Prometheus,
on purpose: `rate` is (last - first) / (t_last - t_first) over the window's samples with
counter resets handled, without Prometheus' extrapolation to the window's edges.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Optional, Union

from pdfleet.operator.observability import metrics_text
from pdfleet.operator.observability.metrics_text import samples
from pdfleet.operator.observability.promql import parse

Labels = tuple[tuple[str, str], ...]          # sorted (name, value) pairs, __name__ included
Vector = dict[Labels, float]
Value = Union[float, Vector]
LOOKBACK_S = 300.0


@dataclass
class Recording:
    """Series recorded from scrapes: {labels: [(t, value)...]} in time order."""
    series: dict[Labels, list[tuple[float, float]]] = field(default_factory=dict)

    def add(self, t: float, name: str, labels: Mapping[str, str], value: float) -> None:
        key = tuple(sorted({**labels, "__name__": name}.items()))
        self.series.setdefault(key, []).append((t, value))

    def add_scrape(self, t: float, text: str, target: Mapping[str, str]) -> None:
        """One /metrics page scraped at t, with target labels (namespace, pod, ...) added like Prometheus."""
        for s in samples(text):
            if not s.name.endswith("_created"):
                self.add(t, s.name, {**s.labels, **target}, s.value)

    def times(self) -> list[float]:
        return sorted({t for points in self.series.values() for t, _ in points})


def _without_name(labels: Labels) -> Labels:
    return tuple(kv for kv in labels if kv[0] != "__name__")


def _matches(labels: Mapping[str, str], matchers: Iterable[Any], variables: Mapping[str, str]) -> bool:
    for m in matchers:
        value = labels.get(m.name, "")
        want = str(m.value)
        for var in sorted(variables, key=len, reverse=True):
            want = want.replace("$" + var, variables[var])
        op = str(m.op).rsplit(".", 1)[-1]
        if op == "Equal" and value != want or op == "NotEqual" and value == want:
            return False
        if op in ("Re", "NotRe") and bool(re.fullmatch(want, value)) != (op == "Re"):
            return False
    return True


class Evaluator:
    def __init__(self, recording: Recording, variables: Optional[Mapping[str, str]] = None) -> None:
        self.recording = recording
        # Grafana variables inside matcher strings, by name: {"namespace": ".*"} for "All".
        self.variables = dict(variables or {})

    def query(self, expr: str, t: float, rate_interval: str = "30s") -> Value:
        return self._eval(parse(expr, {"$__rate_interval": rate_interval, "$__interval": rate_interval}), t)

    # --- nodes ------------------------------------------------------------------
    def _select(self, node: Any, start: float, end: float) -> dict[Labels, list[tuple[float, float]]]:
        name = node.name
        out = {}
        for labels, points in self.recording.series.items():
            d = dict(labels)
            if name and d["__name__"] != name:
                continue
            if not _matches(d, node.matchers.matchers, self.variables):
                continue
            window = [(ts, v) for ts, v in points if start < ts <= end]
            if window:
                out[labels] = window
        return out

    def _eval(self, node: Any, t: float) -> Value:
        import promql_parser as p

        if isinstance(node, p.NumberLiteral):
            return float(node.val)
        if isinstance(node, p.ParenExpr):
            return self._eval(node.expr, t)
        if isinstance(node, p.VectorSelector):
            return {labels: pts[-1][1] for labels, pts in self._select(node, t - LOOKBACK_S, t).items()}
        if isinstance(node, p.Call):
            return self._call(node, t)
        if isinstance(node, p.AggregateExpr):
            return self._aggregate(node, t)
        if isinstance(node, p.BinaryExpr):
            return self._binary(node, t)
        raise NotImplementedError(f"{type(node).__name__} is not supported by the render's evaluator")

    def _call(self, node: Any, t: float) -> Value:
        import promql_parser as p

        name = node.func.name
        if name in ("rate", "increase"):
            (arg,) = node.args
            assert isinstance(arg, p.MatrixSelector), f"{name} needs a range"
            width = arg.range.total_seconds()
            out: Vector = {}
            for labels, pts in self._select(arg.vector_selector, t - width, t).items():
                if len(pts) < 2:
                    continue
                delta = 0.0
                for (_, a), (_, b) in zip(pts, pts[1:]):
                    delta += b - a if b >= a else b  # a counter reset restarts from 0
                span = pts[-1][0] - pts[0][0]
                out[_without_name(labels)] = delta / span if name == "rate" else delta * width / span
            return out
        if name == "histogram_quantile":
            q = self._eval(node.args[0], t)
            vec = self._eval(node.args[1], t)
            assert isinstance(q, float) and isinstance(vec, dict)
            return histogram_quantile(q, vec)
        raise NotImplementedError(f"function {name} is not supported by the render's evaluator")

    def _aggregate(self, node: Any, t: float) -> Vector:
        vec = self._eval(node.expr, t)
        assert isinstance(vec, dict)
        op = str(node.op)
        labels_of = node.modifier.labels if node.modifier is not None else []
        by = node.modifier is None or str(node.modifier.type).endswith("By")
        groups: dict[Labels, list[float]] = {}
        for labels, value in vec.items():
            d = dict(_without_name(labels))
            key = tuple(sorted((k, v) for k, v in d.items() if (k in labels_of) == by))
            groups.setdefault(key, []).append(value)
        fns = {"sum": sum, "max": max, "min": min, "count": len, "avg": lambda xs: sum(xs) / len(xs)}
        if op not in fns:
            raise NotImplementedError(f"aggregation {op} is not supported by the render's evaluator")
        return {k: float(fns[op](vs)) for k, vs in groups.items()}

    def _binary(self, node: Any, t: float) -> Value:
        op = str(node.op)
        if node.modifier is not None and (node.modifier.matching is not None or node.modifier.return_bool):
            raise NotImplementedError("vector matching modifiers are not supported by the render's evaluator")
        lhs, rhs = self._eval(node.lhs, t), self._eval(node.rhs, t)
        if isinstance(lhs, float) and isinstance(rhs, float):
            return _apply(op, lhs, rhs) if op not in _COMPARE else float(_COMPARE[op](lhs, rhs))
        if isinstance(lhs, dict) and isinstance(rhs, dict):
            pairs = {k: (lhs[k], rhs[k]) for k in lhs.keys() & rhs.keys()}
        elif isinstance(lhs, dict):
            pairs = {k: (v, rhs) for k, v in lhs.items()}
        else:
            pairs = {k: (lhs, v) for k, v in rhs.items()}
        out: Vector = {}
        for k, (a, b) in pairs.items():
            if op in _COMPARE:
                if _COMPARE[op](a, b):
                    out[_without_name(k)] = a if isinstance(lhs, dict) else b
            else:
                out[_without_name(k)] = _apply(op, a, b)
        return out


_COMPARE = {">": lambda a, b: a > b, "<": lambda a, b: a < b, ">=": lambda a, b: a >= b,
            "<=": lambda a, b: a <= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def _apply(op: str, a: float, b: float) -> float:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    if op == "/":
        return a / b if b else (math.nan if a == 0 else math.copysign(math.inf, a))
    raise NotImplementedError(f"operator {op} is not supported by the render's evaluator")


def histogram_quantile(q: float, buckets: Vector) -> Vector:
    """Prometheus' histogram_quantile per group of labels (``le`` aside); a group PromQL gives NaN has no point."""
    groups: dict[Labels, dict[float, float]] = {}
    for labels, value in buckets.items():
        d = dict(_without_name(labels))
        le = d.pop("le", None)
        if le is not None:
            groups.setdefault(tuple(sorted(d.items())), {})[float(le)] = value
    return {key: v for key, counts in groups.items() if (v := metrics_text.histogram_quantile(q, counts)) is not None}
