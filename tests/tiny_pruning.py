"""The tiny models, surrogate, tokens and tokenizer of the pruning tests (tests/test_pruning*.py), in one place so
that chunked and unchunked pruning are checked on the very same models and inputs."""

from __future__ import annotations

import functools

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from kvzap.pruning.scorer_presses import SurrogateScorerPress
from kvzap.surrogate.model import Surrogate
from tiny_models import TINY_SIZES

VOCAB = 1000
# tiny_models' sizes with each config class's own special-token ids; a vocabulary the word tokenizer fills
SIZES = {"vocab_size": VOCAB, **{k: v for k, v in TINY_SIZES.items() if not k.endswith("_token_id")}}
WINDOW = 16


FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM),
    "mistral": (functools.partial(MistralConfig, sliding_window=None), MistralForCausalLM),  # as v0.2+ ship
}


def pruning_model(family: str, **overrides):
    torch.manual_seed(0)
    config, cls = FAMILIES[family]
    return cls(config(**{**SIZES, **overrides})).eval().requires_grad_(False)


def tiny_surrogate():
    torch.manual_seed(1)
    return Surrogate(SIZES["hidden_size"], SIZES["num_key_value_heads"], SIZES["num_hidden_layers"]).eval()


def scorer(surrogate):
    return SurrogateScorerPress(surrogate=surrogate)


def random_tokens(n, seed=2):
    return torch.randint(0, VOCAB, (1, n), generator=torch.Generator().manual_seed(seed))


def word_tokenizer():
    """Token <id> is the word `w<id>`: a text written from random ids tokenizes back to exactly those ids."""
    vocab = {"<unk>": 0, "<s>": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", unk_token="<unk>", eos_token="<unk>")
