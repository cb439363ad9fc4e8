"""The router's canary edge, pure parts: the weight label read from slices, the canary chosen beside the
serving revision, the pair chosen per request, the per-revision outcome counted (issue 22)."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving import timing
from pdfleet.connector.serving.canary import choose, parse_weight, prefix_key
from pdfleet.connector.serving.discovery import groups_from_slices, parse_slice
from pdfleet.connector.serving.endpoints import Endpoint, RevisionEndpoints, select_revision
from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.contract import metrics as names


@pytest.mark.parametrize("value,weight", [
    ("0", 0), ("1", 1), ("25", 25), ("100", 100), ("007", 7),
    (None, None), ("", None), ("101", None), ("-5", None), ("12.5", None), ("1e2", None), (" 5", None),
    ("\u0665", None),  # a non-ASCII digit: not a weight
    ("0000", None), (25, None),
])
def test_parse_weight(value, weight) -> None:
    assert parse_weight(value) == weight


def pair(rev: str, *, ready=(True, True), serving=False, weight=None, created=0.0) -> RevisionEndpoints:
    return RevisionEndpoints(rev, (Endpoint(f"http://{rev}-p:1", ready[0]),), (Endpoint(f"http://{rev}-d:1", ready[1]),),
                             created=created, serving=serving, canary_weight=weight)


S = pair("s", serving=True, created=1)


@pytest.mark.parametrize("case,groups,revision,canary,weight", [
    ("no canary label", [S, pair("c", created=2)], "s", None, 0),
    ("canary at 25", [S, pair("c", weight=25, created=2)], "s", "c", 25),
    ("weight 0 (aborted): no canary", [S, pair("c", weight=0, created=2)], "s", None, 0),
    ("canary without a ready decode takes nothing", [S, pair("c", ready=(True, False), weight=50, created=2)],
     "s", None, 0),
    ("the newest of two canaries", [S, pair("c", weight=10, created=2), pair("d", weight=30, created=3)],
     "s", "d", 30),
    ("a labelled-serving group is never the canary", [S, pair("c", serving=True, weight=40, created=2)],
     "c", None, 0),  # the label moved at promotion: c serves, whatever its old weight label says
    ("serving pair down: the newest serviceable serves, and is not its own canary",
     [pair("s", ready=(False, True), serving=True, created=1), pair("c", weight=50, created=2)], "c", None, 0),
    ("nothing serves: no canary either", [pair("c", ready=(False, True), weight=50)], None, None, 0),
])
def test_select_revision_with_a_canary(case, groups, revision, canary, weight) -> None:
    sel = select_revision(groups)
    assert (sel.revision.revision if sel.revision else None) == revision, case
    assert (sel.canary.revision if sel.canary else None) == canary, case
    assert sel.canary_weight == weight, case
    if canary:
        assert f"canary {canary} at {weight}%" in sel.reason


def test_choose_sticks_to_a_conversation_and_splits_by_weight() -> None:
    sel = select_revision([S, pair("c", weight=30, created=2)])
    chat = [{"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"question {i}"},
                          {"role": "assistant", "content": "x"}, {"role": "user", "content": f"turn {t}"}]}
            for i in range(600) for t in (1, 2)]
    picks = [choose(sel, body, chat=True, request_id=f"id-{n}").revision for n, body in enumerate(chat)]
    # the two turns of a conversation (same system prompt and first user turn) go to one pair
    assert all(picks[2 * i] == picks[2 * i + 1] for i in range(600))
    share = picks.count("c") / len(picks) * 100
    assert abs(share - 30) <= 4, share
    # no prefix key (token-id prompt): the request id decides, so retries of one id stick too
    body = {"prompt": [1, 2, 3]}
    assert prefix_key(body, chat=False) is None
    ids = [choose(sel, body, chat=False, request_id=f"r{n}").revision for n in range(1000)]
    assert abs(ids.count("c") / 10 - 30) <= 4
    assert choose(sel, body, chat=False, request_id="r7") == choose(sel, body, chat=False, request_id="r7")


def test_choose_without_a_canary_is_the_serving_pair() -> None:
    sel = select_revision([S])
    assert all(choose(sel, {"prompt": f"p{i}"}, chat=False, request_id=str(i)) is sel.revision for i in range(50))
    assert choose(select_revision([]), {"prompt": "p"}, chat=False, request_id="x") is None


def es(name, role, revision, *, weight=None, serving=False):
    labels = {"pdfleet.io/fleet": "f1", "pdfleet.io/role": role, "pdfleet.io/revision": revision,
              "kubernetes.io/service-name": name}
    if weight is not None:
        labels["pdfleet.io/canary-weight"] = weight
    if serving:
        labels["pdfleet.io/serving"] = "true"
    return {"metadata": {"name": name, "labels": labels}, "ports": [{"name": "http", "port": 8000}],
            "endpoints": [{"addresses": [f"10.0.{len(name)}.1"], "conditions": {"ready": True}}]}


@pytest.mark.parametrize("case,slices,weight", [
    ("both roles labelled", [es("p", "prefill", "c", weight="20"), es("d", "decode", "c", weight="20")], 20),
    ("mid-relabel: the lower share holds", [es("p", "prefill", "c", weight="50"), es("d", "decode", "c", weight="20")],
     20),
    ("one role unlabelled: no canary", [es("p", "prefill", "c", weight="50"), es("d", "decode", "c")], None),
    ("malformed label: no canary", [es("p", "prefill", "c", weight="lots"), es("d", "decode", "c", weight="50")],
     None),
    ("no label", [es("p", "prefill", "c"), es("d", "decode", "c")], None),
])
def test_the_canary_weight_comes_from_the_slices(case, slices, weight) -> None:
    (group,) = groups_from_slices(slices, "f1", "http")
    assert group.canary_weight == weight, case
    view = parse_slice(slices[0], "f1", "http")
    assert not isinstance(view, str)


def test_finished_counts_the_outcome_against_the_requests_revision() -> None:
    metrics = RouterMetrics()

    def count(rev: str, outcome: str) -> float:
        return metrics.registry.get_sample_value(f"{names.ROUTER_REVISION_REQUESTS}_total",
                                                 {"revision": rev, names.REVISION_OUTCOME: outcome}) or 0.0

    timing.finished(502)  # no current request: nothing counted, nothing raised
    import contextvars

    def one(rev: str, status: int) -> None:
        timing.begin(metrics)
        timing.serving(rev)
        timing.finished(status)

    for rev, status in (("a", 200), ("a", 502), ("b", 200), ("b", 400), ("b", 503), ("a", 200)):
        contextvars.copy_context().run(one, rev, status)
    assert (count("a", names.OUTCOME_ANSWERED), count("a", names.OUTCOME_5XX)) == (2, 1)
    assert (count("b", names.OUTCOME_ANSWERED), count("b", names.OUTCOME_5XX)) == (2, 1)  # a 4xx is the client's
