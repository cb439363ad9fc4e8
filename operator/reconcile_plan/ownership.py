"""Whether an object of a child's name is the fleet's to write (pure).

The operator creates or updates a child only when no object of that name exists
or the one that exists names this fleet (by uid) as its controller. Anything
else (a user's own Deployment, a Secret made before the fleet by someone who
wants to know its key) is never taken over: the fleet reports it instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Literal, Optional

from pdfleet.operator.plan.auth import generated_secret_name

Ownership = Literal["absent", "owned", "foreign"]


def ownership(meta: Optional[Mapping[str, Any]], owner_uid: str) -> Ownership:
    """From an existing object's metadata (None: no such object)."""
    if meta is None:
        return "absent"
    refs = meta.get("ownerReferences")
    if not owner_uid or not isinstance(refs, list):
        return "foreign"
    for ref in refs:
        if isinstance(ref, Mapping) and ref.get("controller") is True and ref.get("uid") == owner_uid:
            return "owned"
    return "foreign"


def not_owned_message(fleet: str, refs: Iterable[str]) -> str:
    """The condition's message: what is in the way and what to do."""
    names = sorted(set(refs))
    text = (f"{', '.join(names)} already exist{'s' if len(names) == 1 else ''} and "
            f"{'is' if len(names) == 1 else 'are'} not controlled by this DisaggregatedInference; "
            "the operator does not take over objects it does not own. Delete or rename "
            f"{'it' if len(names) == 1 else 'them'}")
    if f"Secret/{generated_secret_name(fleet)}" in names:
        text += (", or set spec.kvTransfer.authSecretRef to a Secret you manage (a key Secret someone else "
                 "made may be known to them)")
    return text + "."
