"""Pure router logic: revision choice, balancing, lease reuse, leg bodies, config checks."""

from __future__ import annotations

import pytest

from pdfleet.connector.router.app import Router, static_groups
from pdfleet.connector.router.config import RouterConfig
from pdfleet.connector.router.endpoints import (
    DECODE,
    PREFILL,
    Endpoint,
    Outstanding,
    RevisionEndpoints,
    lease_allows_reuse,
    pick_least_outstanding,
    select_revision,
)


def rev(name, created, p_ready=1, p_unready=0, d_ready=1, d_unready=0):
    return RevisionEndpoints(
        revision=name,
        prefill=tuple(Endpoint(f"http://{name}-p{i}", True) for i in range(p_ready))
        + tuple(Endpoint(f"http://{name}-pu{i}", False) for i in range(p_unready)),
        decode=tuple(Endpoint(f"http://{name}-d{i}", True) for i in range(d_ready))
        + tuple(Endpoint(f"http://{name}-du{i}", False) for i in range(d_unready)),
        created=created,
    )


OLD = rev("old", 100)
NEW = rev("new", 200)
NEW_NO_DECODE = rev("new", 200, d_ready=0, d_unready=2)
NEW_NO_PREFILL = rev("new", 200, p_ready=0, p_unready=1)
NEWER_EMPTY = RevisionEndpoints("newer", created=300)


@pytest.mark.parametrize(
    "groups, preferred, expected",
    [
        ([], None, None),
        ([OLD], None, "old"),
        ([OLD, NEW], None, "new"),
        ([NEW, OLD], None, "new"),  # order of discovery does not matter
        ([OLD, NEW_NO_DECODE], None, "old"),  # new revision not ready yet: old keeps serving
        ([OLD, NEW_NO_PREFILL], None, "old"),
        ([OLD, NEW, NEWER_EMPTY], None, "new"),
        ([OLD, NEW], "old", "old"),  # the operator's choice wins when serviceable
        ([OLD, NEW_NO_DECODE], "new", "old"),  # ...and is overridden when not
        ([OLD, NEW], "gone", "new"),
        ([NEW_NO_DECODE], None, None),
        ([rev("a", 5), rev("b", 5)], None, "b"),  # equal age: name decides, same on every replica
    ],
)
def test_select_revision(groups, preferred, expected):
    sel = select_revision(groups, preferred)
    assert (sel.revision.revision if sel.revision else None) == expected
    assert sel.reason


def test_selected_revision_never_mixes_endpoints():
    sel = select_revision([OLD, NEW], None)
    assert all(u.startswith("http://new-") for u in sel.revision.ready(PREFILL) + sel.revision.ready(DECODE))
    assert sel.revision.ready(DECODE) == ("http://new-d0",)  # unready endpoints are never offered


@pytest.mark.parametrize(
    "candidates, outstanding, exclude, ejected, tiebreak, expected",
    [
        ((), {}, (), (), 0, None),
        (("a",), {}, ("a",), (), 0, None),
        (("a", "b", "c"), {"a": 2, "b": 1, "c": 3}, (), (), 0, "b"),
        (("a", "b", "c"), {"a": 2, "b": 1, "c": 3}, ("b",), (), 0, "a"),
        (("a", "b"), {}, (), (), 0, "a"),
        (("a", "b"), {}, (), (), 1, "b"),  # ties rotate
        (("a", "b"), {}, (), (), 7, "b"),
        (("a", "b", "c"), {"b": 0, "c": 0, "a": 5}, (), (), 2, "b"),
        (("a", "b"), {"a": 0, "b": 9}, (), ("a",), 0, "b"),  # recently failed endpoint avoided
        (("a", "b"), {"a": 0, "b": 9}, ("b",), ("a",), 0, "a"),  # ...unless it is the only one left
        (("a", "b"), {"a": 0, "b": 9}, (), ("a", "b"), 0, "a"),
    ],
)
def test_pick_least_outstanding(candidates, outstanding, exclude, ejected, tiebreak, expected):
    assert pick_least_outstanding(candidates, outstanding, exclude=exclude, ejected=ejected,
                                  tiebreak=tiebreak) == expected


def test_outstanding_counts_up_and_down():
    o = Outstanding()
    o.acquire("a")
    o.acquire("a")
    o.acquire("b")
    assert o.counts == {"a": 2, "b": 1}
    o.release("a")
    o.release("b")
    o.release("b")  # a stray release never goes negative
    assert o.counts == {"a": 1}


@pytest.mark.parametrize(
    "params, expected",
    [
        (None, False),
        ({}, False),
        ({"remote_blocks_expiry_time": None}, False),  # upstream vLLM's prefill leaves it None
        ({"remote_blocks_expiry_time": "1000"}, False),
        ({"remote_blocks_expiry_time": True}, False),
        ({"remote_blocks_expiry_time": 1000.0}, True),  # now=990, margin 1: 10 s left
        ({"remote_blocks_expiry_time": 1000}, True),
        ({"remote_blocks_expiry_time": 990.5}, False),  # 0.5 s left < margin
        ({"remote_blocks_expiry_time": 900.0}, False),  # expired
        ({"remote_blocks_expiry_time": 5.0}, False),  # a perf_counter value, not unix time
    ],
)
def test_lease_allows_reuse(params, expected):
    assert lease_allows_reuse(params, now=990.0, margin_s=1.0) is expected


def test_prefill_body_completion_and_chat():
    body = {"model": "m", "prompt": "p", "max_tokens": 50, "stream": True, "stream_options": {"include_usage": True},
            "min_tokens": 4, "temperature": 0.3}
    out = Router.prefill_body(body, chat=False)
    assert out == {"model": "m", "prompt": "p", "max_tokens": 1, "stream": False, "temperature": 0.3,
                   "kv_transfer_params": {"do_remote_decode": True}}
    assert body["max_tokens"] == 50 and body["stream"] is True  # the client's body is not touched
    chat = Router.prefill_body({"model": "m", "messages": [], "max_completion_tokens": 9}, chat=True)
    assert chat["max_tokens"] == 1 and chat["max_completion_tokens"] == 1 and chat["stream"] is False


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(), "prefill/decode"),
        (dict(prefill=("http://a",)), "prefill/decode"),
        (dict(prefill=("a:80",), decode=("http://b",)), "must start with http://"),
        (dict(prefill=("http://a",), decode=("http://b",), max_body_bytes=0), "max_body_bytes"),
        (dict(prefill=("http://a",), decode=("http://b",), prefill_attempts=0), "prefill_attempts"),
        (dict(prefill=("http://a",), decode=("http://b",), prefill_timeout_s=0), "prefill_timeout_s"),
    ],
)
def test_config_rejects_bad_values_naming_the_field(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        RouterConfig(**kwargs)


def test_config_accepts_kubernetes_without_static_lists():
    RouterConfig(kubernetes_fleet="f1")
    RouterConfig(prefill=("http://a",), decode=("https://b/",))


def test_static_groups_strip_trailing_slash():
    [g] = static_groups(RouterConfig(prefill=("http://a:1/",), decode=("http://b:2",)))
    assert g.ready(PREFILL) == ("http://a:1",) and g.ready(DECODE) == ("http://b:2",)
