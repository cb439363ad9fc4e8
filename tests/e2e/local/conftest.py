"""Shared by the `pdfleet local` e2e modules: the tiny model, the prompt sets, and the
answers of a single reference server (run once, alone, before any fleet starts)."""

from __future__ import annotations

import asyncio

import pytest

from local_fleet import ask_all, model_dir, prompt_sets, reference_server, reuse_conversations, reuse_turns


@pytest.fixture(scope="session")
def tiny_model_dir():
    return model_dir()


@pytest.fixture(scope="session")
def prompts(tiny_model_dir):
    return prompt_sets(tiny_model_dir)


@pytest.fixture(scope="session")
def reference(tmp_path_factory, tiny_model_dir, prompts):
    """{label: Answer} from one vLLM server without P/D (the prompt sets, and the turns of local_fleet's
    reuse conversations); stopped before the fleets run."""
    with reference_server(tmp_path_factory.mktemp("reference"), tiny_model_dir) as url:
        answers = asyncio.run(ask_all(url, prompts.all, concurrency=4))
        # conversations whose later prompts hold earlier answers: each turn asked here in order
        turns = asyncio.run(reuse_turns(url, reuse_conversations(tiny_model_dir)))
    by_label = {}
    for req, answer in [*zip(prompts.all, answers), *turns]:
        assert answer.status == 200 and answer.token_ids, (req.label, answer)
        by_label[req.label] = answer
    return by_label
