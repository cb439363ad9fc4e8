"""What Picker.decide weighs: the decode the pick would choose (its chain run without notifying the
scorers), its cached prefix and the prompt's length (PrefixRouting.prompt_tokens), counted only as far
as asked; and it neither counts nor remembers a choice."""

from __future__ import annotations

from pdfleet.connector.serving.endpoints import DECODE
from pdfleet.connector.serving.kvaware.prefix_routing import PrefixRouting
from pdfleet.connector.serving.metrics import RouterMetrics
from pdfleet.connector.serving.picking import chain, profiles
from pdfleet.connector.serving.picking.chain import PickRequest, PickState
from pdfleet.contract.router_config import RouterConfig
from pdfleet.contract.routing import PREFIX_AWARE

BLOCK = 16
D1, D2 = "http://d1", "http://d2"


def routing() -> PrefixRouting:
    return PrefixRouting(RouterConfig(prefill=("http://p",), decode=(D1, D2), block_size=BLOCK), RouterMetrics())


def preview(r: PrefixRouting, body, enough=lambda cached: cached + 128, outstanding=None):
    p = profiles.profile(PREFIX_AWARE, r, r.config.prefix_max_imbalance)
    picked = chain.run((D1, D2), PickState(outstanding or {}), p.filters, p.scorers, PickRequest(DECODE, body),
                       max_imbalance=p.max_imbalance, notify=False)
    cached = int(picked.score)
    return picked.url, cached, r.prompt_tokens(body, chat=False, want=enough(cached))


def decisions(r: PrefixRouting) -> float:
    return sum(s.value for m in r.metrics.prefix_decisions.collect() for s in m.samples if s.name.endswith("_total"))


def test_token_prompts_are_counted_in_whole_blocks_only_as_far_as_asked():
    r = routing()
    body = {"prompt": list(range(1000))}
    assert preview(r, body)[1:] == (0, 128)  # nothing cached: 128 tokens asked, 8 blocks hashed
    assert preview(r, body, enough=lambda c: 10_000)[1:] == (0, 992)  # the whole prompt: 62 whole blocks
    assert preview(r, {"prompt": list(range(31))}, enough=lambda c: 10_000)[1:] == (0, 16)


def test_text_without_a_tokenizer_is_estimated_and_routed_prefixes_count_as_cached():
    r = routing()
    body = {"prompt": "word " * 800}  # 4,000 characters: about 1,000 tokens
    url, cached, tokens = preview(r, body, outstanding={D1: 0, D2: 3})
    assert (url, cached, tokens) == (D1, 0, 1000)  # the least loaded, as pick would choose
    assert decisions(r) == 0 and not r.routed._keys  # a preview is neither counted nor remembered
    p = profiles.profile(PREFIX_AWARE, r, r.config.prefix_max_imbalance)
    assert chain.run((D1, D2), PickState({D1: 0, D2: 3}), p.filters, p.scorers, PickRequest(DECODE, body),
                     max_imbalance=p.max_imbalance).url == D1
    assert decisions(r) == 1  # negative control: a pick is counted and remembered
    url, cached, _ = preview(r, {"prompt": "word " * 800 + "and a new question"}, outstanding={D1: 1, D2: 0})
    assert url == D1 and cached >= 900  # the later turn: decode D1 holds its prefix (routed there)


def test_a_prompt_without_text_is_taken_as_long():
    r = routing()
    assert preview(r, {"prompt_embeds": "AAAA"})[2] == 128  # unknown length: what the decision asked for
