"""The generated tiny Llama: cached by content hash, deterministic, prompt-dependent greedy output."""

from __future__ import annotations

import json

import pytest

from pdfleet.operator.local.tiny_model import (
    CACHE_ENV,
    SPECIAL_TOKENS,
    TinyLlamaSpec,
    build_tokenizer,
    default_cache_root,
    ensure_tiny_model,
    tiny_model_dir,
)

PROMPTS = ["The river runs", "prefill decode cache block", "Winter", "We moves seven hundred", "a quiet garden"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return ensure_tiny_model(cache_root=tmp_path_factory.mktemp("cache"))


def greedy(model_dir, prompts, new_tokens=16):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    outs = []
    with torch.no_grad():
        for p in prompts:
            ids = tok(p, return_tensors="pt").input_ids
            out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
            outs.append(out[0, ids.shape[1]:].tolist())
    return tok, outs


def test_shape_is_the_documented_one(model_dir):
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert (config["hidden_size"], config["num_hidden_layers"]) == (128, 2)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (4, 2)
    assert config["vocab_size"] == 512
    assert config["max_position_embeddings"] >= 4096


def test_cache_dir_is_named_by_content_and_reused(model_dir, tmp_path_factory):
    assert model_dir == tiny_model_dir(cache_root=model_dir.parent)
    assert model_dir.name.startswith("tiny-llama-")
    before = (model_dir / "model.safetensors").stat().st_mtime_ns
    assert ensure_tiny_model(cache_root=model_dir.parent) == model_dir
    assert (model_dir / "model.safetensors").stat().st_mtime_ns == before  # not generated again
    assert tiny_model_dir(TinyLlamaSpec(seed=1), model_dir.parent) != model_dir
    assert [p.name for p in model_dir.parent.iterdir()] == [model_dir.name]  # no temporary leftovers


def test_cache_root_comes_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    assert default_cache_root() == tmp_path
    monkeypatch.delenv(CACHE_ENV)
    assert default_cache_root().name == "pdfleet"


def test_tokenizer_is_deterministic_and_has_a_chat_template():
    a, b = build_tokenizer(TinyLlamaSpec()), build_tokenizer(TinyLlamaSpec())
    assert a.get_vocab() == b.get_vocab()
    assert len(a) <= 512
    text = a.apply_chat_template([{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True)
    assert "hello" in text and text.endswith("<|assistant|>\n")
    assert a.decode(a("any text, even ünïcödé").input_ids) == "any text, even ünïcödé"  # byte level: nothing unknown


def test_greedy_output_depends_on_the_prompt(model_dir):
    tok, outs = greedy(model_dir, PROMPTS)
    assert len({tuple(o) for o in outs}) == len(PROMPTS)  # every prompt its own continuation
    for o in outs:
        assert len(set(o)) >= 4  # not one token repeated
        assert not set(o) & {tok.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}  # never stops early
        text = tok.decode(o)
        assert all(c == "\n" or " " <= c <= "~" for c in text), text


def test_same_seed_same_weights_other_seed_other_output(model_dir, tmp_path):
    from safetensors.torch import load_file

    other = ensure_tiny_model(TinyLlamaSpec(seed=1), cache_root=tmp_path)
    again = ensure_tiny_model(cache_root=tmp_path)
    a, b = load_file(model_dir / "model.safetensors"), load_file(again / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    _, outs = greedy(model_dir, PROMPTS[:2])
    _, other_outs = greedy(other, PROMPTS[:2])
    assert outs != other_outs
