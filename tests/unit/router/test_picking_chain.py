"""The picking chain (serving/picking/): filters -> scorers -> picker, pure."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from pdfleet.connector.serving.picking import chain
from pdfleet.connector.serving.picking.chain import PickRequest, PickState, Weighted
from pdfleet.connector.serving.picking.profiles import FILTERS


class Fixed:
    """A scorer with given scores; records what it heard of each choice."""

    name = "fixed"

    def __init__(self, scores: Mapping[str, float]) -> None:
        self.scores = dict(scores)
        self.heard: list[tuple[str | None, float]] = []

    def score(self, request: PickRequest, candidates: Sequence[str]) -> Mapping[str, float]:
        return {c: self.scores[c] for c in candidates if c in self.scores}

    def chosen(self, request, url, scores, candidates) -> None:
        self.heard.append((url, max((scores.get(c, 0) for c in candidates), default=0)))


@pytest.mark.parametrize(
    "cached, outstanding, exclude, ejected, imbalance, tiebreak, expected, chosen_tokens, best",
    [
        ({}, {}, (), (), 4, 0, "a", 0, 0),  # nothing cached: least outstanding, rotate ties
        ({}, {}, (), (), 4, 1, "b", 0, 0),
        ({}, {"a": 1}, (), (), 4, 0, "b", 0, 0),
        ({"b": 320}, {}, (), (), 4, 0, "b", 320, 320),  # longest cached prefix wins
        ({"a": 64, "b": 320}, {"b": 3}, (), (), 4, 0, "b", 320, 320),  # ...even with some load
        ({"a": 64, "b": 320}, {"b": 5}, (), (), 4, 0, "a", 64, 320),  # ...but not beyond the bound
        ({"a": 64, "b": 320}, {"b": 5, "a": 1}, (), (), 4, 0, "b", 320, 320),  # bound is relative
        ({"b": 320}, {"b": 1}, (), (), 0, 0, "a", 0, 320),  # bound 0: load alone
        ({"a": 320, "b": 320}, {"a": 2, "b": 1}, (), (), 4, 0, "b", 320, 320),  # equal cache: lighter
        ({"a": 320, "b": 320}, {}, (), (), 4, 1, "b", 320, 320),  # equal everything: rotate
        ({"b": 320}, {}, ("b",), (), 4, 0, "a", 0, 0),  # tried already: never again
        ({"b": 320}, {}, (), ("b",), 4, 0, "a", 0, 0),  # failed recently: avoided
        ({"b": 320}, {}, ("a",), ("b",), 4, 0, "b", 320, 320),  # ...unless nothing else is left
        ({"a": 1, "b": 1}, {}, ("a", "b"), (), 4, 0, None, 0, 0),
    ],
)
def test_the_chain_takes_the_longest_prefix_within_the_load_bound(cached, outstanding, exclude, ejected, imbalance,
                                                                  tiebreak, expected, chosen_tokens, best):
    scorer = Fixed(cached)
    got = chain.run(("a", "b"), PickState(outstanding, exclude, ejected, tiebreak), FILTERS, (Weighted(scorer),),
                    PickRequest("prefill", {}), max_imbalance=imbalance)
    assert (got.url, got.score, got.best) == (expected, chosen_tokens, best)
    assert scorer.heard == ([(expected, best)] if expected else [])


def test_hot_prefix_spreads_once_the_bound_is_reached():
    """One prefix, many concurrent requests: the cached replica takes 1 + bound more, then the rest spread."""
    outstanding: dict[str, int] = {}
    picks = []
    for i in range(12):
        url = chain.run(("a", "b", "c"), PickState(outstanding, tiebreak=i), FILTERS, (Weighted(Fixed({"a": 640})),),
                        PickRequest("prefill", {}), max_imbalance=2).url
        outstanding[url] = outstanding.get(url, 0) + 1
        picks.append(url)
    assert picks[:3] == ["a", "a", "a"]
    assert max(outstanding.values()) - min(outstanding.values()) <= 3
    assert outstanding["a"] > outstanding["b"]


@pytest.mark.parametrize("weights, expected", [
    ((1.0, 1.0), "b"),  # 100 + 0 < 0 + 150
    ((1.0, 0.5), "a"),  # 100 > 75: a second scorer combines with the first instead of replacing it
    ((0.0, 1.0), "b"),
])
def test_scorers_combine_by_weight(weights, expected):
    first, second = Fixed({"a": 100, "b": 0}), Fixed({"a": 0, "b": 150})
    got = chain.run(("a", "b"), PickState({}), FILTERS, (Weighted(first, weights[0]), Weighted(second, weights[1])),
                    PickRequest("decode", {}), max_imbalance=4)
    assert got.url == expected
    assert first.heard and second.heard  # every scorer hears the choice


def test_a_preview_notifies_no_scorer_and_no_body_scores_nothing():
    scorer = Fixed({"b": 10})
    assert chain.run(("a", "b"), PickState({}), FILTERS, (Weighted(scorer),), PickRequest("decode", {}),
                     max_imbalance=4, notify=False).url == "b"
    assert chain.run(("a", "b"), PickState({}), FILTERS, (Weighted(scorer),), None, max_imbalance=4).url == "a"
    assert scorer.heard == []
