"""The Secrets a fleet's spec names, and what is wrong with them (pure; issue 39).

``kvTransfer.authSecretRef`` (the side channel's key) and ``model.source.hf.tokenSecretRef`` (the
Hugging Face token) name a Secret and a key in the fleet's namespace. Pods that mount a missing
Secret or key never start (CreateContainerConfigError or a volume that never mounts), so the
operator checks them first: while one is missing, no workload is written (what runs stays as it
is) and the fleet says which Secret and key, and which field named them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional, Sequence

from pdfleet.operator.api.types import DisaggregatedInferenceSpec

# What the edge saw of one Secret: its key names, ABSENT (404), or UNREADABLE (any other failure)
ABSENT = "absent"
UNREADABLE = "unreadable"
Seen = frozenset[str] | str


@dataclass(frozen=True)
class SecretRef:
    field: str   # the spec field that names it
    name: str
    key: str


def referenced_secrets(spec: DisaggregatedInferenceSpec) -> tuple[SecretRef, ...]:
    refs = []
    if spec.kv_transfer.auth_secret_ref is not None:
        ref = spec.kv_transfer.auth_secret_ref
        refs.append(SecretRef("spec.kvTransfer.authSecretRef", ref.name, ref.key))
    hf = spec.model.source.hf if spec.model.source is not None else None
    if hf is not None and hf.token_secret_ref is not None:
        refs.append(SecretRef("spec.model.source.hf.tokenSecretRef", hf.token_secret_ref.name, hf.token_secret_ref.key))
    return tuple(refs)


def secret_problem(ref: SecretRef, seen: Optional[Seen], namespace: str) -> Optional[str]:
    """What is wrong with one reference, or None (present with its key, not checked now, or unreadable:
    a Secret the operator may not read does not stop the fleet; the pods will say)."""
    if seen is None or seen == UNREADABLE:
        return None
    if seen == ABSENT:
        return f"Secret {ref.name} (key {ref.key}, named by {ref.field}) does not exist in namespace {namespace}"
    if ref.key not in seen:
        return f"Secret {ref.name} has no key {ref.key} (named by {ref.field})"
    return None


def missing_message(refs: Sequence[SecretRef], seen: Mapping[str, Seen], namespace: str) -> Optional[str]:
    """The condition's message (None: nothing missing): each problem, then what happens meanwhile."""
    problems = [p for r in refs if (p := secret_problem(r, seen.get(r.name), namespace))]
    if not problems:
        return None
    return "; ".join(problems) + ". No pod is created or changed until it exists; the operator checks again."
