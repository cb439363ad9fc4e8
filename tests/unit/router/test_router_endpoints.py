"""Pure router logic: revision choice, balancing, lease reuse, leg bodies, config checks."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving.router_state import static_groups
from pdfleet.connector.serving.prefill_leg import PrefillLeg
from pdfleet.contract import kv_params
from pdfleet.contract.router_config import RouterConfig
from pdfleet.connector.serving.endpoints import (
    DECODE,
    PREFILL,
    Endpoint,
    Outstanding,
    RevisionEndpoints,
    lease_allows_reuse,
    select_revision,
)
from pdfleet.connector.serving.picking import chain
from pdfleet.connector.serving.picking.chain import PickState
from pdfleet.connector.serving.picking.profiles import FILTERS


def rev(name, created, p_ready=1, p_unready=0, d_ready=1, d_unready=0, serving=False):
    return RevisionEndpoints(
        revision=name,
        prefill=tuple(Endpoint(f"http://{name}-p{i}", True) for i in range(p_ready))
        + tuple(Endpoint(f"http://{name}-pu{i}", False) for i in range(p_unready)),
        decode=tuple(Endpoint(f"http://{name}-d{i}", True) for i in range(d_ready))
        + tuple(Endpoint(f"http://{name}-du{i}", False) for i in range(d_unready)),
        created=created,
        serving=serving,
    )


OLD = rev("old", 100)
NEW = rev("new", 200)
NEW_NO_DECODE = rev("new", 200, d_ready=0, d_unready=2)
NEW_NO_PREFILL = rev("new", 200, p_ready=0, p_unready=1)
NEWER_EMPTY = RevisionEndpoints("newer", created=300)
OLD_SERVING = rev("old", 100, serving=True)
NEW_SERVING = rev("new", 200, serving=True)
NEW_SERVING_NO_DECODE = rev("new", 200, d_ready=0, d_unready=2, serving=True)


@pytest.mark.parametrize(
    "groups, expected, reason",
    [
        ([], None, "no revision has"),
        # no revision labelled serving (static endpoints, an operator from before the label): newest serviceable
        ([OLD], "old", "no revision labelled serving"),
        ([OLD, NEW], "new", "no revision labelled serving"),
        ([NEW, OLD], "new", "no revision labelled"),  # order of discovery does not matter
        ([OLD, NEW_NO_DECODE], "old", "no revision labelled"),  # new revision not ready yet: old keeps serving
        ([OLD, NEW_NO_PREFILL], "old", "no revision labelled"),
        ([OLD, NEW, NEWER_EMPTY], "new", "no revision labelled"),
        ([rev("a", 5), rev("b", 5)], "b", "no revision labelled"),  # equal age: name decides, same on every replica
        # the operator's label wins while its revision is serviceable, even over a newer one
        ([OLD_SERVING, NEW], "old", "labelled serving"),
        ([OLD, NEW_SERVING], "new", "labelled serving"),
        ([OLD_SERVING, NEW_SERVING], "new", "labelled serving"),  # a switch half seen: the newer
        ([OLD_SERVING, NEW_SERVING_NO_DECODE], "old", "labelled serving"),
        # the rule for a serving revision without ready endpoints: newest serviceable, and the reason says so
        ([OLD, NEW_SERVING_NO_DECODE], "old", "serving revision new has no ready prefill and decode endpoint"),
        ([NEW_SERVING_NO_DECODE], None, "no revision has"),
        ([NEW_SERVING_NO_DECODE, NEWER_EMPTY], None, "no revision has"),
    ],
)
def test_select_revision(groups, expected, reason):
    sel = select_revision(groups)
    assert (sel.revision.revision if sel.revision else None) == expected
    assert reason in sel.reason


def test_selected_revision_never_mixes_endpoints():
    sel = select_revision([OLD, NEW])
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
def test_least_outstanding_is_the_chain_without_a_scorer(candidates, outstanding, exclude, ejected, tiebreak,
                                                          expected):
    got = chain.run(candidates, PickState(outstanding, exclude, ejected, tiebreak), FILTERS, (), None, max_imbalance=4)
    assert got.url == expected


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


EXPIRY, SECONDS, VERSION = kv_params.REMOTE_LEASE_EXPIRY, kv_params.REMOTE_LEASE_SECONDS, kv_params.VERSION_KEY
V13 = {VERSION: "1.3"}
RECEIVED, WALL = 100.0, 990.0  # the router's monotonic and wall clocks when prefill's answer arrived


@pytest.mark.parametrize(
    "params, now, expected",
    [
        (None, RECEIVED, False),
        ({}, RECEIVED, False),
        # 1.3: a duration from receipt, on the monotonic clock
        ({**V13, SECONDS: 10.0}, RECEIVED, True),
        ({**V13, SECONDS: 10}, RECEIVED + 8.5, True),  # 1.5 s left, margin 1
        ({**V13, SECONDS: 10.0}, RECEIVED + 9.5, False),  # 0.5 s left < margin
        ({**V13, SECONDS: 10.0}, RECEIVED + 11, False),  # expired
        ({**V13, SECONDS: 0.5}, RECEIVED, False),  # never had the margin
        ({**V13}, RECEIVED, False),  # missing
        ({**V13, SECONDS: None}, RECEIVED, False),
        ({**V13, SECONDS: -10.0}, RECEIVED - 20, False),  # negative: refused, not "10 s in the past"
        ({**V13, SECONDS: float("nan")}, RECEIVED, False),
        ({**V13, SECONDS: float("inf")}, RECEIVED, False),
        ({**V13, SECONDS: True}, RECEIVED, False),
        ({**V13, SECONDS: "10"}, RECEIVED, False),
        ({**V13, SECONDS: kv_params.MAX_LEASE_SECONDS}, RECEIVED, True),
        ({**V13, SECONDS: kv_params.MAX_LEASE_SECONDS + 1}, RECEIVED, False),  # > MAX: absurd
        ({**V13, SECONDS: 1e308}, RECEIVED, False),
        ({**V13, EXPIRY: 1000.0}, RECEIVED, False),  # 1.3 params: an instant is not read
        ({VERSION: "1.9", SECONDS: 10.0}, RECEIVED, True),  # a newer minor version only adds keys
        ({VERSION: "2.0", SECONDS: 10.0}, RECEIVED, False),  # a newer major version: not read, not reused
        # up to 1.2: the prefill's unix expiry, converted with the router's wall clock at receipt
        ({EXPIRY: None}, RECEIVED, False),
        ({EXPIRY: "1000"}, RECEIVED, False),
        ({EXPIRY: True}, RECEIVED, False),
        ({EXPIRY: float("nan")}, RECEIVED, False),
        ({EXPIRY: 1000.0}, RECEIVED, True),  # 10 s left at receipt
        ({EXPIRY: 1000}, RECEIVED + 8.5, True),
        ({EXPIRY: 1000.0}, RECEIVED + 9.5, False),  # 0.5 s left < margin
        ({EXPIRY: 990.5}, RECEIVED, False),
        ({EXPIRY: 900.0}, RECEIVED, False),  # expired
        ({EXPIRY: 5.0}, RECEIVED, False),  # a perf_counter value, not unix time
        ({EXPIRY: 1e308}, RECEIVED, False),  # absurdly far
        ({EXPIRY: 1000, SECONDS: 3000.0}, RECEIVED + 20, False),  # 1.2 params: a duration is not read
        ({EXPIRY: 1000, VERSION: "1.1"}, RECEIVED, True),
        ({EXPIRY: 1000, VERSION: "1.2"}, RECEIVED, True),
        ({EXPIRY: 1000, VERSION: 1.1}, RECEIVED, False),  # malformed version
        ({"remote_blocks_expiry_time": 1000}, RECEIVED, False),  # upstream vLLM's key is not pdfleet's schema
    ],
)
def test_lease_allows_reuse(params, now, expected):
    assert lease_allows_reuse(params, now=now, margin_s=1.0, received_at=RECEIVED, wall_at_receipt=WALL) is expected


def test_a_1_3_lease_is_reused_whatever_the_wall_clock_says():
    """The point of 1.3: a router whose wall clock is an hour off (or steps) reuses within the lease."""
    for wall in (WALL - 3600, WALL, WALL + 3600, None):
        assert lease_allows_reuse({**V13, SECONDS: 10.0}, now=RECEIVED + 5, margin_s=1.0, received_at=RECEIVED,
                                  wall_at_receipt=wall)
    # negative control: the 1.2 form of the same lease (a unix instant from the prefill's clock) read by
    # a router whose wall clock is an hour ahead of the prefill's is refused
    assert lease_allows_reuse({EXPIRY: WALL + 10}, now=RECEIVED + 5, margin_s=1.0, received_at=RECEIVED,
                              wall_at_receipt=WALL)
    assert not lease_allows_reuse({EXPIRY: WALL + 10}, now=RECEIVED + 5, margin_s=1.0, received_at=RECEIVED,
                                  wall_at_receipt=WALL + 3600)


def test_prefill_body_completion_and_chat():
    body = {"model": "m", "prompt": "p", "max_tokens": 50, "stream": True, "stream_options": {"include_usage": True},
            "min_tokens": 4, "temperature": 0.3}
    out = PrefillLeg.prefill_body(body, chat=False)
    assert out == {"model": "m", "prompt": "p", "max_tokens": 1, "stream": False, "temperature": 0.3,
                   "kv_transfer_params": {"do_remote_decode": True}}
    assert body["max_tokens"] == 50 and body["stream"] is True  # the client's body is not touched
    chat = PrefillLeg.prefill_body({"model": "m", "messages": [], "max_completion_tokens": 9}, chat=True)
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
