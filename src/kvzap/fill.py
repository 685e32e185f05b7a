"""The fill policy of an engine whose cache slots hold every KV head of a token (vLLM's paged blocks): at each
judgement, every head of a layer keeps n = the most entries any head keeps (score >= threshold), and the heads under n
keep their next-best entries, so nothing KVzap keeps is dropped and the layer's heads stay the same length. Torch only:
the transformers press and the vLLM plugin both judge with this one function, so their verdicts agree."""

from __future__ import annotations

import math

import torch


def layer_fill(scores: torch.Tensor, threshold: float) -> torch.Tensor:
    """scores (..., H, m) of the m tokens one judgement settles -> keep (..., H, m) bool.

    Each head keeps its n best tokens, n the most any head scores >= threshold; ties go to the older token."""
    if scores.dim() < 2:
        raise ValueError(f"layer_fill takes scores (..., H, m), one row per KV head; got shape {tuple(scores.shape)}")
    if math.isnan(threshold):  # every comparison would be False: the layer would silently keep nothing
        raise ValueError("layer_fill's threshold is NaN: give a log score (-inf keeps everything)")
    n = (scores >= threshold).sum(-1).amax(-1, keepdim=True)  # (..., 1): the layer's count this judgement
    order = scores.argsort(dim=-1, descending=True, stable=True)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(scores.shape[-1]).expand_as(order))
    return rank < n.unsqueeze(-1)
