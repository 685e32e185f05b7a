"""Adapters that let a KVzap surrogate score KV pairs wherever a kvpress ScorerPress is expected."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from kvpress.presses.scorer_press import ScorerPress
from torch import nn

from kvzap.surrogate import Surrogate


@dataclass
class SurrogateScorerPress(ScorerPress):
    """kvpress scorer backed by our surrogate (a local folder or Hub id), e.g. inside kvpress's DMSPress.

    kvpress's own KVzapPress only looks up `nvidia/KVzap-*-<model>` on the Hub; this one takes any checkpoint.
    """

    surrogate_path: str = ""
    surrogate: Surrogate | None = field(default=None, repr=False)

    def post_init_from_model(self, model):
        if self.surrogate is None:
            self.surrogate = Surrogate.from_pretrained(self.surrogate_path)
        self.surrogate.check_matches(model.config)

    def score(self, module: nn.Module, hidden_states: torch.Tensor, keys, values, attentions, kwargs) -> torch.Tensor:
        return self.surrogate.score_layer(module.layer_idx, hidden_states)
