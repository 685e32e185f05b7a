"""The per-head layout (`"layout": "per_head"`): each (layer, KV head) gets its own vLLM attention layer, hence its own
KV cache group and block table (kvzap_vllm.groups makes one group per attention layer), so a head holds blocks for
its own kept entries only and KVzap's per-head verdicts need no fill. vLLM sizes a cache slot to every KV head of its
attention layer; an attention layer of one KV head is the only way to give a head its own slots without changing
vLLM's kernels or block manager.

A decoder layer's `self_attn.attn` (one vLLM Attention over H KV heads) is replaced by `PerHeadAttention`: H vLLM
Attentions of one KV head and its G = num_heads / H query heads each, named `<attn>.h<i>` (vLLM registers each in
the static forward context, where the KV cache spec is collected). The original leaves that context, so it gets no
KV cache. The query heads i*G .. (i+1)*G - 1 attend KV head i, as in vLLM's grouped-query kernels, so the
concatenated outputs are the original layer's."""

from __future__ import annotations

import re

import torch
from torch import nn
from vllm.model_executor.layers.attention import Attention

SUFFIX = re.compile(r"\.h(\d+)$")


class PerHeadAttention(nn.Module):
    """A drop-in for one decoder layer's vLLM Attention: `forward(q, k, v)` with the same shapes, computed per KV head
    by attention layers of one KV head each (attributes h0 .. h{H-1}, so their module paths are their layer names)."""

    def __init__(self, attention: Attention, cache_config):
        super().__init__()
        self.kv_heads, self.head_size = attention.num_kv_heads, attention.head_size
        self.group = attention.num_heads // self.kv_heads
        for i in range(self.kv_heads):
            head = Attention(
                self.group,
                attention.head_size,
                attention.impl.scale,
                num_kv_heads=1,
                cache_config=cache_config,
                quant_config=attention.quant_config,
                prefix=f"{attention.layer_name}.h{i}",
                attn_type=attention.attn_type,
            )
            setattr(self, f"h{i}", head)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        q = query.reshape(-1, self.kv_heads, self.group * self.head_size)
        k = key.reshape(-1, self.kv_heads, self.head_size)
        v = value.reshape(-1, self.kv_heads, self.head_size)
        outputs = [
            getattr(self, f"h{i}")(q[:, i].contiguous(), k[:, i].contiguous(), v[:, i].contiguous())
            for i in range(self.kv_heads)
        ]
        return torch.cat(outputs, -1)


def split_heads(attention_modules: dict[int, nn.Module], vllm_config) -> None:
    """Replace each `self_attn.attn` of `attention_modules` (layer -> self_attn) by its per-head attention. Raises for
    an attention this layout cannot split (another class, sliding windows, KV sharing: refused before, by name)."""
    context = vllm_config.compilation_config.static_forward_context
    for index, module in attention_modules.items():
        attention = module.attn
        plain = type(attention) is Attention and attention.kv_sharing_target_layer_name is None
        if not plain or attention.sliding_window is not None:
            raise ValueError(
                f"KVzap's per-head layout splits vLLM's own Attention layers, not layer {index}'s "
                f"{type(attention).__name__} (sliding or shared KV caches included): serve with the per-layer layout"
            )
        module.attn = PerHeadAttention(attention, vllm_config.cache_config)
        del context[attention.layer_name]


def group_source(layer_names: list[str]) -> tuple[int, int | None]:
    """(decoder layer, KV head or None for every head) of a KV cache group, from its one attention layer's name:
    `model.layers.3.self_attn.attn` (the per-layer layout) or `model.layers.3.self_attn.attn.h1` (per head)."""
    found = re.search(r"layers\.(\d+)\.", layer_names[0]) if len(layer_names) == 1 else None
    if found is None:
        raise ValueError(f"KVzap needs one attention layer per KV cache group, got a group of {layer_names}.")
    head = SUFFIX.search(layer_names[0])
    return int(found.group(1)), None if head is None else int(head.group(1))
