"""The hook every KVzap press shares: score new tokens, judge each token once as it leaves the window.

Runs after each attention layer (so the new tokens saw the full cache, as in the paper and kvpress's
DMSPress). At prefill it turns the layer's dense cache into a `PrunedLayer` (eviction) or `MaskedLayer`
(the masking reference); later forwards append to that layer and, with `decoding=True`, are judged too.
With `prefill_chunk`, a long prefill runs in chunks (kvzap.pruning.chunked) and every chunk is judged.
Subclasses only decide which leaving tokens survive (`select`).
A press is entered by its own `with press(model)` block or by a kvpress wrapper that holds it (ComposedPress,
PrefillDecodingPress): then the wrapper's block enters only its hooks, and `post_init_from_model` does the checks of
entry; a wrapper that takes it for a ScorerPress (DMSPress) is refused by name (kvzap.pruning.wrappers).
"""

from __future__ import annotations

import numbers
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from kvpress.presses.base_press import BasePress
from torch import nn
from transformers.cache_utils import DynamicLayer

from kvzap import families
from kvzap.layer_types import pruned_layers
from kvzap.pruning.attention import use_kvzap_attention
from kvzap.pruning.cache import JudgedLayer, MaskedLayer, PrunedLayer, left_layout, prefill_padding, removed_fraction
from kvzap.pruning.chunked import check_chunk, chunked_prefill
from kvzap.pruning.entry import ModelState, borrow_attention, check_model
from kvzap.pruning.scorer_presses import SurrogateScorerPress
from kvzap.pruning.wrappers import check_company, not_a_scorer, refuse_pipeline_decoding


@dataclass
class WindowedPress(BasePress):
    """Base class: `scorer` gives one score per (batch, kv-head, token); `select` judges leaving tokens.

    Each press declares, after `scorer`, its own positional parameters (KVzapPress: threshold, window,
    decoding, as kvpress's DMSPress; the top-k presses: ratio, window); the base reads `window` and `decoding`.

    Parameters
    ----------
    scorer : kvpress ScorerPress, or a surrogate folder / Hub id (wrapped in SurrogateScorerPress).
    evict : (keyword) True frees dropped entries (PrunedLayer); False masks them in a dense cache (MaskedLayer).
    check_base_model : (keyword) False accepts a surrogate whose recorded base model differs from the
        model's id, e.g. the same weights under another name.
    prefill_chunk : (keyword) None prefills the prompt in one forward; N prefills it N tokens at a time,
        judging each chunk's leaving tokens before the next chunk attends, so the prefill's peak memory and
        attention work follow the kept cache (pruning before attention, left to future work by the paper).
    """

    scorer: object
    evict: bool = field(default=True, kw_only=True)
    check_base_model: bool = field(default=True, kw_only=True)
    prefill_chunk: int | None = field(default=None, kw_only=True)
    # layer -> (removed (B, H), unpruned length, padding (B,)): a snapshot per hook call, divided when read
    removed_counts: dict[int, tuple[torch.Tensor, int, torch.Tensor]] = field(
        default_factory=dict, init=False, repr=False
    )
    # the decoder layers with a full-attention cache: the only ones judged (sliding layers keep their own window)
    full_layers: frozenset[int] = field(default=frozenset(), init=False, repr=False)
    _judging_chunks: bool = field(default=False, init=False, repr=False)
    _active: bool = field(default=False, init=False, repr=False)
    _pruned: bool = field(default=False, init=False, repr=False)
    _hooked: bool = field(default=False, init=False, repr=False)  # a forward has reached the hook

    def __post_init__(self):
        for name in ("evict", "check_base_model"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if isinstance(self.scorer, (str, Path)):
            self.scorer = SurrogateScorerPress(surrogate_path=str(self.scorer), check_base_model=self.check_base_model)
        elif isinstance(self.scorer, SurrogateScorerPress) and not self.check_base_model:
            self.scorer = replace(self.scorer, check_base_model=False)
        if isinstance(self.scorer, WindowedPress) or not callable(getattr(self.scorer, "score", None)):
            raise TypeError(f"scorer must be a kvpress ScorerPress or a surrogate path, got {self.scorer!r}")
        if isinstance(self.window, bool) or not isinstance(self.window, numbers.Integral) or self.window < 0:
            raise ValueError(f"window must be an integer >= 0 (tokens always kept), got {self.window!r}")
        self.window = int(self.window)
        if not isinstance(self.decoding, bool):
            raise ValueError(f"decoding must be True or False, got {self.decoding!r}")
        check_chunk(self.prefill_chunk)

    def select(self, scores: torch.Tensor) -> torch.Tensor:
        """scores (B, H, n) of tokens leaving the window -> keep (B, H, n) bool."""
        raise NotImplementedError

    def post_init_from_model(self, model):
        """Called by `with press(model)`, or by the kvpress wrapper that holds the press (its only entry)."""
        if not self._active:
            refuse_pipeline_decoding(self)
            check_model(self, model, wrapped=True)
        reason = families.pruned_attention_reason(model.config.to_dict())
        if reason:  # refused before any forward: the prefill itself would run without them on the dense layers
            raise NotImplementedError(
                f"{type(self).__name__} cannot prune this {model.config.model_type} model: {reason}."
            )
        layers = pruned_layers(model.config)
        if not layers:
            raise NotImplementedError(
                f"{type(self).__name__}: every layer of this {model.config.model_type} model is sliding-window "
                "attention, whose cache is already bounded: there is no full-attention layer to prune (for prompts "
                "shorter than the window, full attention is the same model: set config.sliding_window = None)."
            )
        self.full_layers = frozenset(layers)
        self.scorer.post_init_from_model(model)
        if self._active:
            use_kvzap_attention(model)  # `with press(model)` restores the model when it ends
        else:
            borrow_attention(model)

    def score(self, module, hidden_states, keys, values, attentions, kwargs):
        """Refused: a wrapper that scores with its press (DMSPress) takes a ScorerPress, not a whole press."""
        raise TypeError(not_a_scorer(self, module))

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        """Refused: a wrapper that compresses with its press takes a ScorerPress, not a whole press."""
        raise TypeError(not_a_scorer(self, module))

    def reset(self) -> None:
        """What PrefillDecodingPress calls on its decoding press as its block ends: nothing to do, each prefill
        starts the press over (so the wrapper's refusal, not a missing method, is what its user sees)."""

    @contextmanager
    def __call__(self, model):
        """Checks everything first (kvzap.pruning.entry), then hooks the model; leaving restores it, keeping the
        "kvzap" attention only if the block left a pruned cache (which no other attention can read)."""
        if self._active:
            raise RuntimeError(
                f"This {type(self).__name__} is already active on a model: leave its `with` block first, "
                "or use another press object."
            )
        refuse_pipeline_decoding(self)
        check_model(self, model)
        state = ModelState.of(model)
        chunks = (
            nullcontext()
            if self.prefill_chunk is None
            else chunked_prefill(model, self.prefill_chunk, self._set_judging_chunks)
        )
        self._active, self._pruned = True, False
        try:
            with super().__call__(model), chunks:
                yield
        finally:
            self._active = False
            state.restore(model, keep_attention=self._pruned)

    def _set_judging_chunks(self, on: bool) -> None:
        self._judging_chunks = on

    @torch.no_grad()  # pruning is a selection: no graph, so grad-enabled forwards run the same ops
    def forward_hook(self, module: nn.Module, input, kwargs: dict, output):
        hidden_states = kwargs["hidden_states"]  # (B, T, D), the attention input
        cache, idx = kwargs.get("past_key_values"), module.layer_idx
        self._hooked = True
        length = hidden_states.shape[1]
        if cache is None or idx not in self.full_layers:  # nothing kept, or a sliding layer (bounded by its window)
            return output
        if not isinstance(cache.layers[idx], JudgedLayer):  # the prefill, or a cache this press did not prefill
            check_company(self, module, self._active)
        if not isinstance(cache.layers[idx], JudgedLayer) and cache.layers[idx].get_seq_length() == length:
            # the prefill (its tokens alone in the cache), told without reading cache_position off the device
            if idx == min(self.full_layers):
                self.removed_counts.clear()
            dense = cache.layers[idx]
            if type(dense) is not DynamicLayer:
                raise TypeError(
                    f"{type(self).__name__} prunes a DynamicCache with full-attention layers, "
                    f"not {type(dense).__name__}"
                )
            pads, right = prefill_padding(kwargs.get("attention_mask"))
            if pads and not self._judging_chunks and max(pads) == length:
                raise ValueError(f"Row {pads.index(length)} of the batch is all padding: give every row a token.")
            keys, values = dense.keys, dense.values
            if right:  # the layers keep padding in front: move it there, and the inputs the scorer reads with it
                keys, values, hidden_states = (left_layout(x, pads, -2) for x in (keys, values, hidden_states))
            cache.layers[idx] = (
                PrunedLayer(keys, values, pads or None, grows=self.decoding)
                if self.evict
                else MaskedLayer(keys, values, pads or None)
            )
            self._pruned = True
        elif not ((self.decoding or self._judging_chunks) and isinstance(cache.layers[idx], JudgedLayer)):
            return output
        elif self._judging_chunks:  # a chunk of a left-padded batch may still be padding for its short rows
            cache.layers[idx].note_padding(kwargs.get("attention_mask"))
        layer = cache.layers[idx]
        keys, values = layer.newest(length)
        layer.set_scores(self.scorer.score(module, hidden_states, keys, values, None, kwargs))
        n_leaving = layer.window_len - self.window
        if n_leaving > 0:
            layer.judge(n_leaving, self._select_rows(layer.scores[..., :n_leaving], layer.window_pads()))
        # (B, H) entries removed, the unpruned length and each row's padding, divided only when a ratio is read
        self.removed_counts[idx] = layer.removed, layer.seen, layer.pad_counts
        return output

    def _select_rows(self, scores: torch.Tensor, pads: list[int]) -> torch.Tensor:
        """`select` on each row's own leaving tokens: its padding (at the front) is dropped and not shown to
        `select`, so a row of a padded batch is judged exactly as it would be alone."""
        if not any(pads):
            return self.select(scores)
        keep = torch.zeros_like(scores, dtype=torch.bool)
        for row, pad in enumerate(pads):
            if pad < scores.shape[-1]:
                keep[row : row + 1, :, pad:] = self.select(scores[row : row + 1, :, pad:])
        return keep

    @property
    def compression_ratio(self) -> float:
        """Fraction of entries removed, mean over the pruned layers (kvpress DMSPress's definition; a hybrid model's
        sliding layers are not pruned and not counted: `kvzap.pruning.held_kv_bytes` gives the memory of all).
        0 while a forward has judged nothing yet: ComposedPress reads it after every layer, sliding ones included."""
        if self._hooked and not self.removed_counts:
            return 0.0
        return self.layer_ratios.mean().item()

    @compression_ratio.setter
    def compression_ratio(self, value):
        raise AttributeError(f"compression_ratio of {type(self).__name__} is measured, not set")

    @property
    def layer_ratios(self) -> torch.Tensor:
        """(pruned layers,) fraction removed per layer, averaged over batch and kv-heads."""
        return self.head_ratio_table.mean(-1)

    @property
    def head_ratio_table(self) -> torch.Tensor:
        """(pruned layers, H) fraction removed per layer and kv-head, averaged over the batch."""
        return self._table().mean(1)

    @property
    def sample_ratios(self) -> torch.Tensor:
        """(B,) fraction removed per sample, averaged over layers and kv-heads."""
        return self._table().mean((0, 2))

    def _table(self) -> torch.Tensor:
        if not self.removed_counts:
            raise RuntimeError("Run a forward pass under the press before reading its compression ratio.")
        return torch.stack(
            [removed_fraction(*self.removed_counts[i]).cpu() for i in sorted(self.removed_counts)]
        )  # (layers, B, H)
