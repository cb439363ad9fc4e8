"""Pure router decision: which request bodies vLLM fans out into several engine requests."""

from __future__ import annotations

import pytest

from pdfleet.connector.serving.fanout import fan_out_reason


@pytest.mark.parametrize("body, reason", [
    ({"prompt": "hi"}, None),
    ({"prompt": "hi", "n": 1}, None),
    ({"prompt": "hi", "n": None}, None),  # chat's default
    ({"prompt": ["hi"]}, None),  # one prompt in a list
    ({"prompt": [1, 2, 3]}, None),  # token ids: one prompt
    ({"prompt": [[1, 2, 3]]}, None),
    ({"prompt": []}, None),  # vLLM refuses it; no reason to split
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]}, None),  # chat: one prompt
    ({"prompt": "hi", "use_beam_search": False}, None),
    ({"prompt": "hi", "n": True}, None),  # a bool is not a count (vLLM refuses it)
    ({"prompt": "hi", "n": "2"}, None),  # nor a string
    ({"prompt": "hi", "logprobs": 2, "echo": True, "stop": ["\n"]}, None),
    ({"prompt": "hi", "n": 2}, "n=2"),
    ({"messages": [{"role": "user", "content": "a"}], "n": 3}, "n=3"),
    ({"prompt": "hi", "use_beam_search": True}, "use_beam_search"),
    ({"prompt": ["a", "b"]}, "2 prompts"),
    ({"prompt": [[1, 2], [3, 4], [5]]}, "3 prompts"),
    ({"prompt": ["a", [1, 2]]}, "2 prompts"),
    ({"prompt_embeds": ["AAAA", "BBBB"]}, "2 prompt_embeds"),
    ({"prompt_embeds": ["AAAA"]}, None),
    ({"prompt_embeds": "AAAA"}, None),
])
def test_fan_out_reason(body, reason):
    assert fan_out_reason(body) == reason
