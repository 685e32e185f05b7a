"""Tiny random Llama / Qwen3 models and a tokenizer trained in-process: no hub, sub-second to build."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

TEXT = (
    "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
    "Paul Graham wrote essays about startups, programming languages and how to do great work. "
    "The special magic number is 7341982. Remember it, because you will be asked about it later. "
    "Repeat the previous context exactly. What is the special magic number? Answer: "
) * 4


def tiny_tokenizer(vocab_size: int = 400) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<unk>", "<|im_start|>", "<|im_end|>", "<eos>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([TEXT], trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", eos_token="<|im_end|>", pad_token="<eos>")
    fast.chat_template = CHATML
    return fast


# The sizes of every tiny test model (GQA with 2 KV heads, untied embeddings); tests override what they need.
TINY_SIZES = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=4096,
    eos_token_id=2,
    pad_token_id=3,
    bos_token_id=None,
    tie_word_embeddings=False,
)


def tiny_config(family: str, vocab_size: int, **overrides):
    common = {**TINY_SIZES, "vocab_size": vocab_size, **overrides}
    return LlamaConfig(**common) if family == "llama" else Qwen3Config(**common)


def tiny_model(family: str, vocab_size: int = 400, seed: int = 0, attn: str = "sdpa", **overrides):
    torch.manual_seed(seed)
    config = tiny_config(family, vocab_size, **overrides)
    config._attn_implementation = attn
    cls = LlamaForCausalLM if family == "llama" else Qwen3ForCausalLM
    return cls(config).eval().requires_grad_(False)
