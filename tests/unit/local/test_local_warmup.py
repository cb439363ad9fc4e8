"""warmup_plan: which P/D requests `pdfleet local` sends each pair before the router line."""

from __future__ import annotations

import argparse

import pytest

from pdfleet.operator.local.command import _non_negative_int
from pdfleet.operator.local.warmup import warmup_plan

P0, P1, D0, D1 = "http://p0", "http://p1", "http://d0", "http://d1"


@pytest.mark.parametrize("prefills, decodes, rounds, pairs", [
    ([P0], [D0], 1, [[(P0, D0)]]),
    ([P0, P1], [D0], 2, [[(P0, D0), (P1, D0)]] * 2),  # every round warms every pair
    ([P0, P1], [D0, D1], 1, [[(P0, D0), (P0, D1), (P1, D0), (P1, D1)]]),
    ([P0], [D0], 0, []),  # --warmup-rounds 0
    ([], [D0], 2, []),  # no pair without both roles
    ([P0], [], 2, []),
])
def test_every_pair_every_round(prefills, decodes, rounds, pairs):
    plan = warmup_plan(prefills, decodes, rounds)
    assert [[(r.prefill, r.decode) for r in rnd] for rnd in plan] == pairs


def test_every_request_has_a_prompt_of_its_own_long_enough_to_move_whole_blocks():
    prompts = [r.prompt for rnd in warmup_plan([P0, P1], [D0, D1], 3) for r in rnd]
    assert len(set(prompts)) == len(prompts) == 12  # a fresh prefill each time: every request moves KV
    assert min(len(p.split()) for p in prompts) >= 3 * 32  # several 32-token blocks (a word is a token or more)


def test_negative_rounds_are_refused():
    with pytest.raises(ValueError, match="rounds"):
        warmup_plan([P0], [D0], -1)


@pytest.mark.parametrize("text, ok", [("0", 0), ("3", 3), ("-1", None), ("two", None)])
def test_the_flag_takes_integers_from_zero(text, ok):
    if ok is None:
        with pytest.raises(argparse.ArgumentTypeError, match="integer >= 0"):
            _non_negative_int(text)
    else:
        assert _non_negative_int(text) == ok
