"""Adapters that let a KVzap surrogate score KV pairs wherever a kvpress ScorerPress is expected."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from kvpress.presses.scorer_press import ScorerPress
from torch import nn

from kvzap.surrogate.model import Surrogate, resolve_folder


@dataclass
class SurrogateScorerPress(ScorerPress):
    """kvpress scorer backed by our surrogate (a local folder or Hub id), e.g. inside kvpress's DMSPress.

    kvpress's own KVzapPress only looks up `nvidia/KVzap-*-<model>` on the Hub; this one takes any checkpoint.
    A local folder is checked at construction (a Hub id is fetched when the press attaches); attaching
    refuses a surrogate trained for another model unless `check_base_model=False`.
    """

    surrogate_path: str = ""
    surrogate: Surrogate | None = field(default=None, repr=False)
    check_base_model: bool = True

    def __post_init__(self):
        super().__post_init__()
        if self.surrogate is None:
            if not self.surrogate_path:
                raise ValueError("SurrogateScorerPress needs surrogate_path (a folder or Hub id) or a surrogate.")
            resolve_folder(self.surrogate_path)

    def post_init_from_model(self, model):
        if self.surrogate is None:
            self.surrogate = Surrogate.from_pretrained(self.surrogate_path)
        self.surrogate.check_matches(model.config, self.check_base_model)

    def score(self, module: nn.Module, hidden_states: torch.Tensor, keys, values, attentions, kwargs) -> torch.Tensor:
        return self.surrogate.score_layer(module.layer_idx, hidden_states)


@dataclass
class PrecomputedScorerPress(ScorerPress):
    """Scores computed beforehand, e.g. the KVzip+ oracle (`kvzap.oracle.scores.oracle_scores(...).kvzip_plus_log`).

    `scores` is (layers, kv_heads, T) for one prompt, or (layers, batch, kv_heads, T); cache position p reads
    column p - offset (offset = where the scored span starts in the prefilled ids). Tokens outside the scored
    span get +inf: without evidence they are kept.
    """

    scores: torch.Tensor | None = field(default=None, repr=False)
    offset: int = 0

    def score(self, module: nn.Module, hidden_states: torch.Tensor, keys, values, attentions, kwargs) -> torch.Tensor:
        table = self.scores[module.layer_idx]
        table = table[None] if table.dim() == 2 else table  # (B|1, H, T)
        columns = kwargs["cache_position"].to(table.device) - self.offset  # (q_len,)
        inside = (columns >= 0) & (columns < table.shape[-1])
        picked = table[..., columns.clamp(0, table.shape[-1] - 1)].float()
        picked = picked.masked_fill(~inside, torch.inf)
        return picked.expand(hidden_states.shape[0], -1, -1).to(hidden_states.device)
