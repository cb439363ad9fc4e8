"""The side channel's key: the user's Secret, or one the operator generates per fleet (pure).

Secure by default: without ``kvTransfer.authSecretRef`` the engines still sign every
side-channel message, with a key the operator generates once per fleet and keeps in
the Secret ``<fleet>-kv-auth`` (owned by the fleet). The plan only *mounts* that
Secret; the key itself is never part of the plan (``pdfleet render`` shows no key),
the status or a log line: the reconciler creates the Secret with ``generated_secret``
and never reads it back.
"""

from __future__ import annotations

import base64
from typing import Any, Optional

from pdfleet.contract import labels
from pdfleet.operator.api.types import DisaggregatedInferenceSpec
from pdfleet.operator.plan import naming

GENERATED_KEY = "key"
KEY_BYTES = 32
GENERATED_ANNOTATION = labels.GENERATED


def generated_secret_name(fleet: str) -> str:
    return f"{fleet}-kv-auth"


def auth_secret(fleet: str, spec: DisaggregatedInferenceSpec) -> tuple[str, str]:
    """(Secret name, key) the engines mount: the user's, else the generated one."""
    ref = spec.kv_transfer.auth_secret_ref
    if ref is not None:
        return ref.name, ref.key
    return generated_secret_name(fleet), GENERATED_KEY


def needs_generated_secret(spec: DisaggregatedInferenceSpec) -> bool:
    return spec.kv_transfer.auth_secret_ref is None


def generated_secret(fleet: str, namespace: str, key: bytes, owner: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The Secret holding a generated key (hex text, so that it is also a valid text file)."""
    if len(key) < 16:
        raise ValueError("a generated side-channel key must have at least 16 bytes")
    meta: dict[str, Any] = {
        "name": generated_secret_name(fleet),
        "namespace": namespace,
        "labels": naming.fleet_labels(fleet),
        "annotations": {GENERATED_ANNOTATION: "side-channel-key"},
    }
    if owner:
        meta["ownerReferences"] = [dict(owner)]
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "Opaque",
        # Never changed after creation: immutable Secrets are also cheaper for the kubelet.
        "data": {GENERATED_KEY: base64.b64encode(key.hex().encode()).decode()},
    }
