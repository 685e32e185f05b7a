"""Where a transformers causal LM keeps what KVzap reads: its decoder stack, each layer's attention module and that
module's output projection. Found by the names the families use, so no family needs code of its own; a miss is an
error naming what was looked for (the oracle and the presses say which model they refuse)."""

from __future__ import annotations

import torch
from torch import nn
from transformers import PreTrainedModel

ATTENTION_NAMES = ("self_attn", "attention", "self_attention", "attn")  # a decoder layer's attention submodule
OUTPUT_NAMES = ("o_proj", "dense", "out_proj", "c_proj", "wo")  # an attention module's output projection


def decoder(model: PreTrainedModel) -> nn.Module:
    """The decoder stack a CausalLM wraps (a composite model's language model): no LM head."""
    base = model.base_model
    return getattr(base, "language_model", base)


def attention_modules(model: PreTrainedModel) -> list[nn.Module]:
    """The attention module of each decoder layer (self_attn, or GPT-NeoX's attention, ...)."""
    modules = [_attention_of(layer) for layer in decoder(model).layers]
    if any(m is None for m in modules):
        raise NotImplementedError(
            f"some decoder layers have no attention module named one of {', '.join(ATTENTION_NAMES)}"
        )
    return modules


def _attention_of(layer: nn.Module) -> nn.Module | None:
    for name in ATTENTION_NAMES:
        module = getattr(layer, name, None)
        if isinstance(module, nn.Module):
            return module
    return None


def output_projection(module: nn.Module) -> torch.Tensor:
    """W_O (D, H_q * d_v) of an attention module: query head h owns columns [h d_v, (h + 1) d_v)."""
    for name in OUTPUT_NAMES:
        linear = getattr(module, name, None)
        if isinstance(linear, nn.Linear):
            return linear.weight
    raise NotImplementedError(
        f"{type(module).__name__} has no output projection named one of {', '.join(OUTPUT_NAMES)}"
    )
