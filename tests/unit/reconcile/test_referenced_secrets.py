"""The edge that reads the Secrets a spec names (issue 39): key names only, a confirmed Secret is not read
again for a while (a resync with nothing changed reads nothing), a missing one at every reconcile."""

from __future__ import annotations

from pdfleet.operator.kube.client import ApiFailure
from pdfleet.operator.reconcile.referenced_secrets import RECHECK_SECONDS, ReferencedSecrets
from pdfleet.operator.reconcile_plan.secret_refs import ABSENT, UNREADABLE, SecretRef

HF = SecretRef("spec.model.source.hf.tokenSecretRef", "hf", "token")
KV = SecretRef("spec.kvTransfer.authSecretRef", "kv", "k")


class Secrets:
    """A client with ``get_secret_keys`` only: name -> key names, None (absent) or an HTTP status to fail with."""

    def __init__(self, answers):
        self.answers, self.reads = answers, []

    async def get_secret_keys(self, namespace, name):
        self.reads.append((namespace, name))
        answer = self.answers.get(name)
        if isinstance(answer, int):
            raise ApiFailure(f"GET secrets/{name}", answer, "forbidden")
        return answer


async def test_present_absent_and_unreadable():
    client = Secrets({"hf": frozenset({"token"}), "kv": None})
    seen = await ReferencedSecrets(client).check("ns", [HF, KV])
    assert seen == {"hf": frozenset({"token"}), "kv": ABSENT}
    client.answers["kv"] = 403
    assert (await ReferencedSecrets(client).check("ns", [KV]))["kv"] == UNREADABLE


async def test_a_confirmed_secret_is_not_read_again_until_the_recheck_and_a_missing_one_is():
    now = [0.0]
    client = Secrets({"hf": frozenset({"token"}), "kv": frozenset({"other"})})
    edge = ReferencedSecrets(client, clock=lambda: now[0])
    await edge.check("ns", [HF, KV])
    await edge.check("ns", [HF, KV])
    assert client.reads == [("ns", "hf"), ("ns", "kv"), ("ns", "kv")]  # kv lacks its key: read each time
    now[0] = RECHECK_SECONDS + 1
    await edge.check("ns", [HF])
    assert client.reads[-1] == ("ns", "hf")
    # Another key of the same Secret is not confirmed by the first one's check.
    await edge.check("ns", [SecretRef("f", "hf", "token2")])
    assert client.reads[-1] == ("ns", "hf") and len(client.reads) == 5
    # Nor another namespace's Secret of that name.
    await edge.check("other", [HF])
    assert client.reads[-1] == ("other", "hf")
