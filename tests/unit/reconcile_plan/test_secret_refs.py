"""The Secrets a spec names, checked before the pods are made (pure; issue 39)."""

from __future__ import annotations

import pytest
from fleet_builders import NOW, Fleet, observed

from pdfleet.operator import api
from pdfleet.operator.plan import kinds
from pdfleet.operator.reconcile_plan.plan import guard, reconcile_plan, settle
from pdfleet.operator.reconcile_plan.secret_refs import ABSENT, UNREADABLE, missing_message, referenced_secrets

AUTH = {"kvTransfer": {"authSecretRef": {"name": "kv-key", "key": "k"}}}
HF = {"model": {"name": "meta-llama/Llama-3.1-8B", "source": {"hf": {"tokenSecretRef": {"name": "hf", "key": "token"}}}}}


def refs(**spec):
    return referenced_secrets(api.parse(Fleet().spec(**spec).body()).spec)


def test_the_fields_that_name_secrets():
    assert [(r.field, r.name, r.key) for r in refs(**AUTH, **HF)] == [
        ("spec.kvTransfer.authSecretRef", "kv-key", "k"), ("spec.model.source.hf.tokenSecretRef", "hf", "token")]
    assert refs() == ()


@pytest.mark.parametrize("seen, has", [
    ({"hf": ABSENT}, ["Secret hf (key token, named by spec.model.source.hf.tokenSecretRef) does not exist in "
                      "namespace ns", "No pod is created"]),
    ({"hf": frozenset({"other"})}, ["Secret hf has no key token (named by spec.model.source.hf.tokenSecretRef)"]),
])
def test_missing_secret_or_key_is_named(seen, has):
    message = missing_message(refs(**HF), seen, "ns")
    for text in has:
        assert text in message


@pytest.mark.parametrize("seen", [{"hf": frozenset({"token", "x"})}, {"hf": UNREADABLE}, {}])
def test_present_unreadable_or_unchecked_is_no_problem(seen):
    """Negative controls: the key is there; the operator may not read it (the pods will say); not read now."""
    assert missing_message(refs(**HF), seen, "ns") is None


def _guarded(body, seen, last=None):
    plan = reconcile_plan(observed(body, [], []))  # nothing created yet
    return plan, guard(plan, name="llama", secrets_seen=seen, last_secret_missing=last)


def test_no_workload_is_written_while_a_named_secret_is_missing():
    body = Fleet().spec(**HF).body()
    plan, g = _guarded(body, {"hf": ABSENT})
    assert not [o for o in g.actions.apply if o["kind"] in kinds.WORKLOAD_KINDS]
    assert [o for o in g.actions.apply if o["kind"] == "Service"]  # the rest goes
    assert [e.reason for e in g.events_before] == ["SecretMissing"]
    done = settle(plan, g, now=NOW)
    conds = {c["type"]: c for c in done.status["conditions"]}
    assert (conds["Ready"]["status"], conds["Ready"]["reason"]) == ("False", "SecretMissing")
    assert "Secret hf (key token" in conds["Ready"]["message"]
    assert conds["Progressing"]["reason"] == "SecretMissing" and conds["Stalled"]["status"] == "False"
    assert done.error and "Secret hf" in done.error  # retried with backoff
    # The same problem next time: no second event.
    assert _guarded(body, {"hf": ABSENT}, last=g.secret_missing)[1].events_before == ()
    # Negative control: once it exists with its key, the workloads go.
    _, ok = _guarded(body, {"hf": frozenset({"token"})})
    assert [o for o in ok.actions.apply if o["kind"] in kinds.WORKLOAD_KINDS] and ok.secret_missing is None
