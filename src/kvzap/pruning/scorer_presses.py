"""Adapters that let a KVzap surrogate score KV pairs wherever a kvpress ScorerPress is expected.

Both give one score per token they are shown, from that token alone (its hidden state, or its cache position), so
they serve every press and wrapper that scores the tokens of a forward (ours, DMSPress, AdaKVPress, KeyRerotationPress,
...), and refuse by name one that shows them other tokens than the scores are for (DecodingPress scoring the whole
cache from the last hidden states; ChunkPress showing the precomputed scores a slice of the forward). A wrapper that
never calls `post_init_from_model` (PerLayerCompressionPress) gets them attached at the first score.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from kvpress.presses.scorer_press import ScorerPress
from torch import nn

from kvzap.layer_types import pruned_layers
from kvzap.pruning.wrappers import caller_name
from kvzap.surrogate.model import Surrogate, apply_layer, placed_like, resolve_folder


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
    # per layer, the surrogate layer in the dtype and device its hidden states come in (a given surrogate is
    # the caller's: it is never cast in place; one this press loaded is its own)
    _layers: dict[int, nn.Module] = field(default_factory=dict, init=False, repr=False)
    _owns_surrogate: bool = field(default=False, init=False, repr=False)
    _attached: bool = field(default=False, init=False, repr=False)

    def __post_init__(self):
        super().__post_init__()
        if self.surrogate is not None and not isinstance(self.surrogate, Surrogate):
            raise TypeError(
                f"surrogate must be a kvzap Surrogate (Surrogate.from_pretrained(...)), got {type(self.surrogate)}"
            )
        if self.surrogate is None:
            if not self.surrogate_path:
                raise ValueError("SurrogateScorerPress needs surrogate_path (a folder or Hub id) or a surrogate.")
            resolve_folder(self.surrogate_path)
        if not isinstance(self.check_base_model, bool):
            raise ValueError(f"check_base_model must be True or False, got {self.check_base_model!r}")

    def post_init_from_model(self, model):
        self._attach(model.config)

    def _attach(self, config) -> None:
        if self.surrogate is None:
            self.surrogate, self._owns_surrogate = Surrogate.from_pretrained(self.surrogate_path), True
        self._layers.clear()  # a given surrogate may have been trained further since the last block
        self.surrogate.check_matches(config, self.check_base_model)
        self._attached = True

    def score(self, module: nn.Module, hidden_states: torch.Tensor, keys, values, attentions, kwargs) -> torch.Tensor:
        if keys is not None and keys.shape[-2] != hidden_states.shape[1]:
            outer = caller_name(self, module)
            raise ValueError(
                f"{outer} asked SurrogateScorerPress to score {keys.shape[-2]} cached tokens from "
                f"{hidden_states.shape[1]} hidden states, but a surrogate scores each token from its own hidden "
                "state, once, when it arrives: for pruning while decoding use KVzapPress(..., decoding=True) or "
                "DMSPress(SurrogateScorerPress(...), decoding=True)."
            )
        if not self._attached:  # a wrapper that does not pass post_init_from_model on
            self._attach(module.config)
        idx = module.layer_idx
        layer = self._layers.get(idx)
        if layer is None or not placed_like(layer, hidden_states):
            layer = self._layers[idx] = self.surrogate.layer_like(idx, hidden_states, self._owns_surrogate)
        return apply_layer(layer, hidden_states)


@dataclass
class PrecomputedScorerPress(ScorerPress):
    """Scores computed beforehand, e.g. the KVzip+ oracle (`kvzap.oracle.scores.oracle_scores(...).kvzip_plus_log`).

    `scores` is (layers, kv_heads, T) for one prompt, or (layers, batch, kv_heads, T), over every decoder layer or
    over the pruned (full-attention) layers only, as the oracle scores a hybrid model (`OracleScores.layers`); cache
    position p reads column p - offset (offset = where the scored span starts in the prefilled ids). Tokens outside
    the scored span get +inf: without evidence they are kept.
    """

    scores: torch.Tensor | None = field(default=None, repr=False)
    offset: int = 0
    _rows: dict[int, int] = field(default_factory=dict, init=False, repr=False)  # decoder layer -> row of scores

    def __post_init__(self):
        super().__post_init__()
        if not isinstance(self.scores, torch.Tensor) or self.scores.dim() not in (3, 4):
            shape = tuple(self.scores.shape) if isinstance(self.scores, torch.Tensor) else type(self.scores).__name__
            raise ValueError(f"scores must be a (layers, kv_heads, T) or (layers, B, kv_heads, T) tensor, got {shape}")
        if not self.scores.is_floating_point() or bool(self.scores.isnan().any()):
            raise ValueError("scores must be floating point without NaN (a NaN would remove its entry silently)")
        if isinstance(self.offset, bool) or not isinstance(self.offset, int) or self.offset < 0:
            raise ValueError(f"offset must be an integer >= 0 (where the scored span starts), got {self.offset!r}")

    def post_init_from_model(self, model):
        self._attach(model.config)

    def _attach(self, config) -> None:
        pruned = pruned_layers(config)
        layers = range(config.num_hidden_layers) if self.scores.shape[0] == config.num_hidden_layers else pruned
        got, heads = (self.scores.shape[0], self.scores.shape[-2]), config.num_key_value_heads
        if got != (len(layers), heads):
            full = (
                "" if len(pruned) == config.num_hidden_layers else f" or, over its full-attention layers, {len(pruned)}"
            )
            raise ValueError(
                f"scores have (layers, kv_heads) = {got}, the model ({config.num_hidden_layers}{full}, {heads}): "
                "compute them with this model."
            )
        self._rows = {layer: row for row, layer in enumerate(layers)}

    def score(self, module: nn.Module, hidden_states: torch.Tensor, keys, values, attentions, kwargs) -> torch.Tensor:
        positions = kwargs["cache_position"].shape[0]
        shown = hidden_states.shape[1] if keys is None else keys.shape[-2]
        if hidden_states.shape[1] != positions or shown != positions:
            raise ValueError(
                f"{caller_name(self, module)} asked PrecomputedScorerPress to score {shown} tokens of a forward over "
                f"{positions}, but its scores are read at the forward's cache positions: use it where the tokens "
                "of a whole forward are scored (KVzapPress, DMSPress, AdaKVPress, ... rather than ChunkPress, "
                "BlockPress or DecodingPress)."
            )
        if not self._rows:  # a wrapper that does not pass post_init_from_model on
            self._attach(module.config)
        table = self.scores[self._rows[module.layer_idx]]
        table = table[None] if table.dim() == 2 else table  # (B|1, H, T)
        if table.shape[0] not in (1, hidden_states.shape[0]):
            raise ValueError(f"scores hold {table.shape[0]} samples, the forward {hidden_states.shape[0]}")
        columns = kwargs["cache_position"].to(table.device) - self.offset  # (q_len,)
        inside = (columns >= 0) & (columns < table.shape[-1])
        picked = table[..., columns.clamp(0, table.shape[-1] - 1)].float()
        picked = picked.masked_fill(~inside, torch.inf)
        return picked.expand(hidden_states.shape[0], -1, -1).to(hidden_states.device)
