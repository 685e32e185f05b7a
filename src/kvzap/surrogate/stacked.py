"""Every scored layer's MLP as one batched network, for training: each step is two batched matmuls over all layers
instead of 2 x L small ones and their autograd nodes. The function and the numbers are the Surrogate's per-layer
modules', copied in at the start and written back at the end."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kvzap.surrogate.model import Surrogate


class StackedMLP(nn.Module):
    """w1 (L, D, hidden), b1 (L, 1, hidden), w2 (L, hidden, H), b2 (L, 1, H) for the L scored layers."""

    def __init__(self, surrogate: Surrogate):
        super().__init__()
        if surrogate.hidden_dim is None:
            raise TypeError("StackedMLP stacks MLP surrogates; a linear one is fitted by ridge regression.")
        layers = [surrogate.layers[i] for i in surrogate.scored]
        self.w1 = nn.Parameter(torch.stack([layer[0].weight.detach().T for layer in layers]).contiguous())
        self.b1 = nn.Parameter(torch.stack([layer[0].bias.detach() for layer in layers])[:, None].contiguous())
        self.w2 = nn.Parameter(torch.stack([layer[2].weight.detach().T for layer in layers]).contiguous())
        self.b2 = nn.Parameter(torch.stack([layer[2].bias.detach() for layer in layers])[:, None].contiguous())

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h (N, L, D) -> (N, L, H), as Surrogate.forward."""
        hidden = F.gelu(torch.baddbmm(self.b1, h.transpose(0, 1), self.w1))
        return torch.baddbmm(self.b2, hidden, self.w2).transpose(0, 1)

    @torch.no_grad()
    def write_into(self, surrogate: Surrogate) -> Surrogate:
        for row, i in enumerate(surrogate.scored):
            first, second = surrogate.layers[i][0], surrogate.layers[i][2]
            first.weight.copy_(self.w1[row].T)
            first.bias.copy_(self.b1[row, 0])
            second.weight.copy_(self.w2[row].T)
            second.bias.copy_(self.b2[row, 0])
        return surrogate
