"""The fleet's generated Secrets (pure): the side channel's key (the user's Secret, or one the
operator generates per fleet) and the engines' API token (always generated).

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

from pdfleet.contract import env as env_names
from pdfleet.contract import labels
from pdfleet.contract.gateway import CALLER_AUTH_TOKEN
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
    return _secret(generated_secret_name(fleet), namespace, fleet, "side-channel-key", GENERATED_KEY, key, owner)


def _secret(name: str, namespace: str, fleet: str, purpose: str, data_key: str, value: bytes,
            owner: Optional[dict[str, Any]]) -> dict[str, Any]:
    """A generated Secret: ``value`` as hex text under ``data_key``, owned by the fleet. Never changed
    after creation."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": naming.fleet_labels(fleet),
        "annotations": {GENERATED_ANNOTATION: purpose},
    }
    if owner:
        meta["ownerReferences"] = [dict(owner)]
    return {"apiVersion": "v1", "kind": "Secret", "metadata": meta, "type": "Opaque",
            "data": {data_key: base64.b64encode(value.hex().encode()).decode()}}


# The engines' API token (issue 30): vLLM's --api-key, through VLLM_API_KEY, so that the engines'
# OpenAI API answers only the fleet (the router, and the EPP). /health and /metrics stay open to the
# kubelet and Prometheus: vLLM 0.32 guards only the paths under /v1, /v2, /inference and /cohere.
API_TOKEN_KEY = "token"


def api_secret_name(fleet: str) -> str:
    return f"{fleet}-engine-api"


def api_token_env(fleet: str, name: str) -> dict[str, Any]:
    """An env entry holding the fleet's engine API token, from its Secret (never a literal value).
    The engines get it as VLLM_API_KEY, the router as ENGINE_API_KEY; the EPP's Deployment mounts it
    the same way (``api_token_env(fleet, env_names.ENGINE_API_KEY)``)."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": api_secret_name(fleet), "key": API_TOKEN_KEY}}}


def engine_api_token_env(fleet: str) -> dict[str, Any]:
    return api_token_env(fleet, env_names.VLLM_API_KEY)


def client_api_token_env(fleet: str) -> dict[str, Any]:
    """For whatever sends requests to the engines: the router, the EPP."""
    return api_token_env(fleet, env_names.ENGINE_API_KEY)


def generated_api_secret(fleet: str, namespace: str, token: bytes, owner: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The Secret holding the engines' API token (hex text: a header-safe bearer token)."""
    if len(token) < 16:
        raise ValueError("a generated engine API token must have at least 16 bytes")
    return _secret(api_secret_name(fleet), namespace, fleet, "engine-api-token", API_TOKEN_KEY, token, owner)


# The Endpoint Picker's caller token (issue 38): only the fleet's gateway may open ext_proc streams on the
# EPP (connector/epp/caller_auth.py), because they hand out the engine token and run prefill legs. Its own
# Secret, not a key of <fleet>-engine-api: the gateway's side (an EnvoyPatchPolicy or EnvoyFilter, docs/
# gateway.md) needs this token and must not need the engines' one; and a generated Secret is never changed
# after creation, so a new key in an existing one would never reach fleets made before.
EPP_CALLER_KEY = "token"


def epp_caller_secret_name(fleet: str) -> str:
    return f"{fleet}-epp-caller"


def epp_caller_token_env(fleet: str) -> dict[str, Any]:
    """The EPP's caller token, from its Secret (never a literal value)."""
    return {"name": env_names.EPP_CALLER_TOKEN,
            "valueFrom": {"secretKeyRef": {"name": epp_caller_secret_name(fleet), "key": EPP_CALLER_KEY}}}


def needs_epp_caller_secret(spec: DisaggregatedInferenceSpec) -> bool:
    pool = spec.gateway.inference_pool
    return pool.enabled and pool.caller_auth == CALLER_AUTH_TOKEN


def generated_epp_caller_secret(fleet: str, namespace: str, token: bytes,
                                owner: Optional[dict[str, Any]]) -> dict[str, Any]:
    """The Secret holding the EPP's caller token (hex text: 64 characters from 32 random bytes)."""
    if len(token) < 16:
        raise ValueError("a generated EPP caller token must have at least 16 bytes")
    return _secret(epp_caller_secret_name(fleet), namespace, fleet, "epp-caller-token", EPP_CALLER_KEY, token, owner)
