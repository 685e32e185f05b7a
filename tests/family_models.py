"""The family matrix: a tiny random decoder per transformers family, shared by tests/test_families.py (whose outcome
is docs/families.md's table) and the hybrid-model tests, so both build a family's model the same way."""

from __future__ import annotations

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from tiny_models import TINY_SIZES

COMMON = {**TINY_SIZES, "hidden_size": 128, "head_dim": 32}  # wider heads than tiny_config's default
MOE = dict(num_experts=4, num_local_experts=4, num_experts_per_tok=2, moe_intermediate_size=64)
WIDE_WINDOW = dict(sliding_window=4096)  # longer than every prompt here: sliding layers see everything

# model_type -> config overrides; every family in this matrix runs the oracle and, where its cache allows, the presses
FAMILIES = {
    "llama": {},
    "mistral": dict(sliding_window=None),  # as Mistral-7B v0.2+ ship; v0.1's 4096 window would be a sliding cache
    "qwen2": {},
    "qwen3": {},
    "qwen3_moe": MOE,
    "qwen2_moe": dict(MOE, shared_expert_intermediate_size=64),
    "mixtral": MOE,
    "olmoe": MOE,
    "granitemoe": MOE,
    "phi3": {},
    "olmo": {},
    "olmo2": {},
    "gemma": {},
    "gemma2": WIDE_WINDOW,
    "gemma3_text": dict(WIDE_WINDOW, query_pre_attn_scalar=32),
    "cohere": {},
    "cohere2": WIDE_WINDOW,
    "granite": dict(attention_multiplier=0.1),
    "stablelm": {},
    "phi": {},
    "starcoder2": {},
    "gpt_neox": dict(num_key_value_heads=4),
    "helium": {},
    "glm": {},
    "glm4": {},
    "smollm3": {},
    "arcee": {},
    "seed_oss": {},
    "ernie4_5": {},
    "exaone4": WIDE_WINDOW,
    "gpt_oss": dict(MOE, **WIDE_WINDOW),
    "apertus": {},
    "hunyuan_v1_dense": {},
    "granitemoeshared": dict(MOE, shared_intermediate_size=64),
    "dots1": dict(MOE, n_routed_experts=4, n_shared_experts=1, first_k_dense_replace=1),
    "olmo3": WIDE_WINDOW,
    "ministral": WIDE_WINDOW,
}
EAGER_ONLY = {"gpt_oss"}  # no sdpa (attention sinks)
# Hybrid caches: sliding-window layers get a DynamicSlidingWindowLayer, which KVzap leaves alone.
SLIDING_CACHE = {"gemma2", "gemma3_text", "cohere2", "exaone4", "gpt_oss", "olmo3", "ministral"}
# kvpress (and so the presses) hook model.model.layers[i].self_attn; GPT-NeoX has gpt_neox.layers[i].attention.
NOT_KVPRESS_LAYOUT = {"gpt_neox"}


def build(model_type: str, vocab_size: int, **overrides):
    config = AutoConfig.for_model(model_type, vocab_size=vocab_size, **{**COMMON, **FAMILIES.get(model_type, {})})
    for key, value in overrides.items():
        setattr(config, key, value)
    config._attn_implementation = "eager" if model_type in EAGER_ONLY else "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).float().eval().requires_grad_(False)
