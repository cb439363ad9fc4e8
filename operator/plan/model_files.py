"""Where a pod finds the model's files (pure): the engines load the weights, the router and the Endpoint Picker
the tokenizer (prefix routing hashes prompts with it as the engines do), from the same place and with the same
credentials: the PVC read-only at MODEL_DIR, or the Hub with the model's token Secret and a writable cache."""

from __future__ import annotations

from typing import Any

from pdfleet.operator.api.types import DisaggregatedInferenceSpec

MODEL_DIR = "/models"  # a pvc source's mount; spec.model.name is a path under it
HF_CACHE_DIR = "/cache/huggingface"
HF_CACHE_VOLUME = "hf-cache"
MODEL_VOLUME = "model"
# The front ends download only the tokenizer's files (a few MB); the bound keeps a wrong model id from filling
# the node's disk under a read-only root.
FRONT_END_CACHE_LIMIT = "1Gi"


def hf_token_env(spec: DisaggregatedInferenceSpec) -> list[dict[str, Any]]:
    """HF_TOKEN from the model's token Secret, when it has one (a gated or private model)."""
    source = spec.model.source
    if not (source and source.hf and source.hf.token_secret_ref):
        return []
    ref = source.hf.token_secret_ref
    return [{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def hf_cache(size_limit: str | None = None) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """HF_HOME on a writable emptyDir: (env, volume, mount)."""
    empty_dir = {"sizeLimit": size_limit} if size_limit else {}
    return ([{"name": "HF_HOME", "value": HF_CACHE_DIR}], {"name": HF_CACHE_VOLUME, "emptyDir": empty_dir},
            {"name": HF_CACHE_VOLUME, "mountPath": HF_CACHE_DIR})


def model_volume(spec: DisaggregatedInferenceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The pvc source read-only at MODEL_DIR (its subPath if set): (volumes, mounts), empty without one."""
    source = spec.model.source
    if not (source and source.pvc):
        return [], []
    mount = {"name": MODEL_VOLUME, "mountPath": MODEL_DIR, "readOnly": True}
    if source.pvc.sub_path:
        mount["subPath"] = source.pvc.sub_path
    return [{"name": MODEL_VOLUME, "persistentVolumeClaim": {"claimName": source.pvc.claim_name, "readOnly": True}}], [
        mount]


def tokenizer_files(spec: DisaggregatedInferenceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                                 list[dict[str, Any]]]:
    """What a front end needs to load the tokenizer under its read-only root: (env, volumes, mounts). Always a
    writable HF_HOME (the Hub's files are cached there); the token Secret and the PVC as the engines get them."""
    env, cache_volume, cache_mount = hf_cache(FRONT_END_CACHE_LIMIT)
    volumes, mounts = model_volume(spec)
    return env + hf_token_env(spec), [cache_volume, *volumes], [cache_mount, *mounts]
