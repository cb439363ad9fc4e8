"""Whether an object of a child's name is the fleet's to write (pure; issue 20 rows 2-3)."""

from __future__ import annotations

import pytest

from pdfleet.operator.reconcile_plan.ownership import not_owned_message, ownership

OURS = {"apiVersion": "pdfleet.io/v1alpha1", "kind": "DisaggregatedInference", "name": "llama", "uid": "U",
        "controller": True}


@pytest.mark.parametrize("meta, expected", [
    (None, "absent"),
    ({"name": "x", "ownerReferences": [OURS]}, "owned"),
    ({"name": "x", "ownerReferences": [{"uid": "other", "controller": True}, OURS]}, "owned"),
    ({"name": "x"}, "foreign"),  # made by hand
    ({"name": "x", "ownerReferences": None}, "foreign"),
    ({"name": "x", "ownerReferences": [{**OURS, "uid": "U-old"}]}, "foreign"),  # a deleted fleet of the same name
    ({"name": "x", "ownerReferences": [{**OURS, "controller": False}]}, "foreign"),  # only a non-controller ref
    ({"name": "x", "ownerReferences": [{**OURS, "controller": "true"}]}, "foreign"),  # wrong type
    ({"name": "x", "ownerReferences": ["junk"]}, "foreign"),
])
def test_ownership(meta, expected):
    assert ownership(meta, "U") == expected


def test_no_uid_owns_nothing():
    assert ownership({"ownerReferences": [{**OURS, "uid": ""}]}, "") == "foreign"


@pytest.mark.parametrize("refs, has, lacks", [
    (["Deployment/llama-router"], ["Deployment/llama-router already exists and is not controlled", "Delete or "
                                   "rename it."], ["authSecretRef"]),
    (["Service/b", "Deployment/a", "Service/b"], ["Deployment/a, Service/b already exist and are", "rename them."],
     ["authSecretRef"]),
    (["Secret/llama-kv-auth"], ["Secret/llama-kv-auth already exists", "spec.kvTransfer.authSecretRef"], []),
    (["Secret/other-kv-auth"], [], ["authSecretRef"]),  # another fleet's name: not the key Secret
])
def test_message_names_the_objects_and_what_to_do(refs, has, lacks):
    text = not_owned_message("llama", refs)
    assert all(h in text for h in has), text
    assert not any(x in text for x in lacks), text
