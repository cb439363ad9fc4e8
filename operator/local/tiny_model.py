"""A tiny Llama generated on the spot, for local fleets and tests (no hub access).

`ensure_tiny_model()` returns the directory of a small Llama (hidden 128, 2 layers,
4 heads, 2 KV heads, vocab 512, 4096 positions) with a byte-level BPE tokenizer trained
on a built-in corpus and a chat template, saved with transformers so vLLM can serve it.

Everything is seeded, and the directory name carries a hash of every input, so a
second call (from any process) reuses the cached copy. Weights are scaled so that
greedy output depends on the prompt (default random init repeats one token, which
would make P/D-versus-single-server comparisons too weak to mean anything), and the
special tokens can never win a greedy step, so outputs always run to max_tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

TINY_MODEL_NAME = "pdfleet/tiny-llama"
CACHE_ENV = "PDFLEET_CACHE_DIR"
# Bump when the generator changes in a way that changes the files it writes.
GENERATOR_VERSION = 2
_COMPLETE_MARKER = ".pdfleet-complete"

SPECIAL_TOKENS = ["<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

_WORDS = (
    "the a an of to in on at by for with from into over under between through prefill decode "
    "cache block token engine model request router fleet cluster node pod queue memory transfer "
    "network latency throughput batch layer head attention vector matrix value key query sum "
    "river mountain forest garden window kitchen winter summer morning evening yellow purple "
    "quick slow bright quiet heavy light small large green blue red cold warm old new first last "
    "runs moves reads writes sends holds keeps waits starts stops grows falls turns opens closes "
    "we you they it she he one two three four five six seven eight nine ten hundred thousand "
    "and or but so because when while after before if then again always never often sometimes"
).split()


@dataclass(frozen=True)
class TinyLlamaSpec:
    """Every input that shapes the generated files; its hash names the cache directory."""

    seed: int = 0
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    vocab_size: int = 512
    max_position_embeddings: int = 4096
    logit_scale: float = 6.0
    corpus_sentences: int = 3000

    def digest(self) -> str:
        payload = json.dumps({"v": GENERATOR_VERSION, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:12]


def default_cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    return Path("~/.cache/pdfleet").expanduser()


def tiny_model_dir(spec: TinyLlamaSpec = TinyLlamaSpec(), cache_root: Path | None = None) -> Path:
    root = Path(cache_root) if cache_root is not None else default_cache_root()
    return root / f"tiny-llama-{spec.digest()}"


def is_tiny_model_name(name: str) -> bool:
    return name == TINY_MODEL_NAME


def ensure_tiny_model(spec: TinyLlamaSpec = TinyLlamaSpec(), cache_root: Path | None = None) -> Path:
    """Return the model directory, generating it first when the cache lacks it.

    Generation writes into a temporary sibling and renames it into place, so a
    concurrent caller either sees a complete directory or none.
    """
    target = tiny_model_dir(spec, cache_root)
    if (target / _COMPLETE_MARKER).is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        _write_model(spec, tmp)
        tmp.chmod(0o755)  # mkdtemp makes it private; other users of the cache read it
        (tmp / _COMPLETE_MARKER).write_text(spec.digest() + "\n")
        try:
            os.rename(tmp, target)
        except OSError:
            # Someone else finished first (or a stale incomplete copy is in the way).
            if not (target / _COMPLETE_MARKER).is_file():
                shutil.rmtree(target, ignore_errors=True)
                os.rename(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def build_corpus(seed: int, sentences: int) -> list[str]:
    """Pseudo-English sentences from a fixed word list (deterministic for a seed)."""
    rng = random.Random(seed)
    lines = []
    for _ in range(sentences):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 14))]
        sentence = " ".join(words).capitalize() + rng.choice([".", ".", "?", "!", ","])
        if rng.random() < 0.2:
            sentence += f" {rng.randint(0, 9999)}"
        lines.append(sentence)
    return lines


def build_tokenizer(spec: TinyLlamaSpec):
    """A byte-level BPE tokenizer (any text encodes) wrapped for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(build_corpus(spec.seed, spec.corpus_sentences), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        pad_token="<pad>",
        model_max_length=spec.max_position_embeddings,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def build_model(spec: TinyLlamaSpec, tokenizer):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    gen = torch.Generator().manual_seed(spec.seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            elif "embed_tokens" in name:
                param.copy_(torch.randn(param.shape, generator=gen))
            elif name == "lm_head.weight":
                scale = spec.logit_scale / spec.hidden_size**0.5
                param.copy_(torch.randn(param.shape, generator=gen) * scale)
            else:
                # Unit-gain init: each block changes the residual stream as much as
                # the embedding does, so the continuation depends on the context.
                fan_in = param.shape[-1]
                param.copy_(torch.randn(param.shape, generator=gen) / fan_in**0.5)
        # Special tokens and unused ids get a zero logit, far below the winners:
        # greedy never stops early or emits an id the tokenizer cannot decode.
        model.lm_head.weight[unprintable_token_ids(tokenizer, spec.vocab_size)] = 0.0
    model.generation_config.do_sample = False
    return model


def unprintable_token_ids(tokenizer, vocab_size: int) -> list[int]:
    """Ids greedy decoding must never pick: special tokens, ids past the tokenizer, and
    byte tokens that are not printable ASCII (so outputs read as text and stream cleanly)."""
    special = {tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    never = []
    for token_id in range(vocab_size):
        if token_id in special or token_id >= len(tokenizer):
            never.append(token_id)
            continue
        text = tokenizer.decode([token_id])
        if not text or not all(c == "\n" or " " <= c <= "~" for c in text):
            never.append(token_id)
    return never


def _write_model(spec: TinyLlamaSpec, out: Path) -> None:
    tokenizer = build_tokenizer(spec)
    model = build_model(spec, tokenizer)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="generate (or find) the tiny pdfleet Llama")
    parser.add_argument("--cache-dir", type=Path, default=None, help=f"cache root (default ${CACHE_ENV} or ~/.cache/pdfleet)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(ensure_tiny_model(TinyLlamaSpec(seed=args.seed), args.cache_dir))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
