"""Whether the fleet's prefix routing has the model's tokenizer, from its front ends' /metrics (issue 39 part 3).

Each router and Endpoint Picker pod exports ROUTER_TOKENIZER_LOADED, one series whose reason is Loaded or why not
(contract/metrics.TOKENIZER_REASONS). ``condition`` turns every ready front end's reading into the fleet's
PrefixRouting condition (pure, table-tested); ``read`` is its I/O edge over kube/front_ends.scrape. The reconcile
hands the condition to the status as it hands ScalingLimited (a (status, reason, message) tuple), read at most
once per interval per fleet (reconcile/reconciler.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Optional

from pdfleet.contract import metrics as names
from pdfleet.contract.routing import PREFIX_AWARE
from pdfleet.operator.api import conditions
from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.kube import front_ends
from pdfleet.operator.kube.observed import ObservedPod
from pdfleet.operator.observability.metrics_text import series, usable_samples

PREFIX_ROUTING, NOT_READ = conditions.PREFIX_ROUTING, conditions.NOT_READ
Condition = tuple[str, str, str]  # (status, reason, message), as ScalingLimited


def tokenizer_reason(text: str) -> Optional[str]:
    """The reason of one front end's ROUTER_TOKENIZER_LOADED (None: not exported, e.g. no leg is prefixAware)."""
    found = series(usable_samples(text), names.ROUTER_TOKENIZER_LOADED)
    return found[0].labels.get(names.TOKENIZER_REASON) if found else None


def needed(spec: DisaggregatedInferenceSpec) -> bool:
    return PREFIX_AWARE in (spec.router.prefill_policy, spec.router.decode_policy)


def condition(spec: DisaggregatedInferenceSpec, readings: Mapping[str, Optional[str]],
              failures: Sequence[str] = ()) -> Optional[Condition]:
    """PrefixRouting from each front-end pod's reason (pure). None: no leg is prefixAware (no condition).
    True/Loaded when every pod read has the tokenizer; Unknown/Loading while one loads; else False with the first
    failing pod's reason (Gated, NotFound, Unreachable, ...) and every failing pod named in the message."""
    if not needed(spec):
        return None
    reasons = {pod: r for pod, r in sorted(readings.items()) if r is not None}
    if not reasons:
        why = "; ".join(failures) or "no ready router or Endpoint Picker pod to read"
        return "Unknown", NOT_READ, f"the front ends' tokenizer state is not known yet: {why}"[:1000]
    failing = {pod: r for pod, r in reasons.items() if r not in (names.TOKENIZER_LOADED, names.TOKENIZER_LOADING)}
    if failing:
        listed = ", ".join(f"{pod}: {r}" for pod, r in failing.items())
        return "False", next(iter(failing.values())), (
            f"no tokenizer for {spec.model.name} ({listed}): prefix routing scores prompts by text chunks, not by "
            "the engines' KV blocks; see docs/troubleshooting.md")[:1000]
    loading = [pod for pod, r in reasons.items() if r == names.TOKENIZER_LOADING]
    if loading:
        return "Unknown", names.TOKENIZER_LOADING, f"loading the tokenizer of {spec.model.name}: {', '.join(loading)}"
    return "True", names.TOKENIZER_LOADED, f"every front end hashes prompts with the tokenizer of {spec.model.name}"


async def read(spec: DisaggregatedInferenceSpec, pods: Sequence[ObservedPod],
               fetch: Callable[[str], Awaitable[str]]) -> Optional[Condition]:
    """The condition from a scrape of the fleet's ready front ends (none when no leg is prefixAware)."""
    if not needed(spec):
        return None
    # scrape tells a failure by its str: each reading travels in a 1-tuple
    read_, failures = await front_ends.scrape(front_ends.metrics_targets(pods, spec.router.port), fetch,
                                              lambda text: (tokenizer_reason(text),))
    return condition(spec, {pod: r[0] for pod, r in read_.items()}, failures)
