"""The oracle's attention function: it sees what the model's own attention sees, and scores from it.

transformers hands every attention function the queries and keys after the family's projections, norms and
positional encoding (fused qkv, whole-projection q/k norms, partial rotary, NoPE layers), together with the
call's scaling, soft-cap and attention sinks. Scoring there, instead of recomputing queries from `q_proj`,
needs no per-family code. The function computes the output with the attention implementation the model was
loaded with (same masks, same kernel), so the forward and every later layer run exactly as without the oracle.

A forward pre-hook on each attention module keeps its input h (for ||h_j|| and the surrogate's inputs); W_O
per query head is read from the module's output projection, found by name (kvzap.introspection).

Hybrid models (Gemma 2/3, gpt-oss, Cohere 2, OLMo 3, Ministral, EXAONE 4...): their sliding-window (and chunked)
layers keep their own bounded cache, so KVzap never scores, trains or prunes them (kvzap.layer_types); the scorer
hooks and scores only the full-attention layers. The sliding layers still run, with the window mask transformers
builds for them from the config, so every later layer sees the model's own hidden states.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from kvzap import families, introspection
from kvzap.layer_types import pruned_layers

PREFIX = "kvzap_oracle_"  # + the implementation that computes the output, e.g. kvzap_oracle_sdpa

_ACTIVE: ContextVar[LayerScorer | None] = ContextVar("kvzap_oracle_scorer", default=None)


def _refusal(model: PreTrainedModel, reason: str) -> str:
    return f"The KVzap oracle cannot score {model.config.model_type} models: {reason}."


def _modules_and_projections(
    model: PreTrainedModel, layers: list[int]
) -> tuple[list[nn.Module], dict[int, torch.Tensor]]:
    """Every layer's attention module and the scored layers' W_O, or the oracle's refusal naming what is missing."""
    try:
        modules = introspection.attention_modules(model)
        return modules, {i: introspection.output_projection(modules[i]) for i in layers}
    except NotImplementedError as err:
        raise NotImplementedError(_refusal(model, str(err))) from None


def check_family(model: PreTrainedModel) -> None:
    """Refuse, before any forward, a family whose cache is not per-head keys and values the oracle can score (the
    planner's rules, kvzap.families, read here off the loaded config, which always lists its layer types)."""
    layers = pruned_layers(model.config)
    reason = families.out_of_reach(model.config.to_dict())
    if reason is None and not layers:  # e.g. a sliding_window without listed layer types
        reason = families.ALL_SLIDING
    if reason:
        raise NotImplementedError(_refusal(model, reason))
    _modules_and_projections(model, layers)
    if not model._can_set_attn_implementation():
        raise NotImplementedError(_refusal(model, "its attention does not go through transformers' AttentionInterface"))


class LayerScorer:
    """Oracle state across the forwards of one prompt, for the full-attention `layers` only (decoder indices).
    During the user-turn prefill (`scored` None) it keeps the attention inputs at `keep_positions` (and with
    `keep_kv` the keys and values the attention received there); during a repeat forward it scores the context
    positions `scored` by the last `n_repeat` queries."""

    def __init__(self, model: PreTrainedModel, context: slice, query_chunk: int, keep_positions, keep_kv: bool):
        self.layers = pruned_layers(model.config)
        every, self.w_o = _modules_and_projections(model, self.layers)
        self.index = {every[i]: i for i in self.layers}  # the modules the hooks and the attention function watch
        self.query_chunk, self.keep_positions, self.keep_kv = query_chunk, keep_positions, keep_kv
        self.context_start, self.n_ctx = context.start, context.stop - context.start
        self.scored: slice | None = None
        self.n_repeat = 0
        self.inputs: dict[int, torch.Tensor] = {}  # layer -> (n, D) attention input of the current forward
        self.kvzip: dict[int, torch.Tensor] = {}  # layer -> (H_kv, C)
        self.plus_log: dict[int, torch.Tensor] = {}
        self.hidden: dict[int, torch.Tensor] = {}
        self.kv: dict[int, torch.Tensor] = {}
        self.grams: dict[int, torch.Tensor] = {}  # layer -> (H_kv, g, d, d) W_O^h^T W_O^h

    def keep_input(self, module: nn.Module, args, kwargs) -> None:
        """Forward pre-hook: the attention input h (batch of one)."""
        h = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        layer = self.index[module]
        self.inputs[layer] = h[0]
        if self.scored is None and self.keep_positions is not None:
            self.hidden[layer] = h[0, self.context_start + self.keep_positions.to(h.device)].cpu()

    def observe(self, module: nn.Module, query, key, value, scaling: float, softcap, sinks) -> None:
        """query (1, H_q, n, d), key/value (1, H_kv, T, d) as the module's attention receives them."""
        layer = self.index[module]
        if self.scored is None:
            if self.keep_kv:  # the cache as the model wrote it: RoPE'd (and normed) keys, in its dtype
                rows = self.context_start + self.keep_positions.to(key.device)
                self.kv[layer] = torch.cat([key[0, :, rows], value[0, :, rows]], dim=-1).cpu()
            return
        kvzip, plus = self._score(layer, query[0], key[0], value[0], scaling, softcap, sinks)
        for table, scores in ((self.kvzip, kvzip), (self.plus_log, plus.log())):
            if layer not in table:
                table[layer] = torch.zeros(scores.shape[0], self.n_ctx)
            local = slice(self.scored.start - self.context_start, self.scored.stop - self.context_start)
            table[layer][:, local] = scores.cpu()

    def _value_norms(self, layer: int, values: torch.Tensor, group: int) -> torch.Tensor:
        """values (H_kv, C, d) -> (H_kv, g, C) = ||W_O^h v_i||, as sqrt(v_i^T G_h v_i) with G_h = W_O^h^T W_O^h (d x d):
        d^2 operations per head and token instead of d x D for the (D,) product itself."""
        n_kv, _, d = values.shape
        gram = self._gram(layer, n_kv, group, d)  # (H_kv, g, d, d)
        squared = ((values[:, None] @ gram) * values[:, None]).sum(dim=-1)  # (H_kv, g, C)
        return squared.clamp_min_(0).sqrt_()

    def _gram(self, layer: int, n_kv: int, group: int, d: int) -> torch.Tensor:
        """G_h = W_O^h^T W_O^h of every query head of a layer, once per prompt (float32)."""
        if layer not in self.grams:
            w_o = self.w_o[layer].float()
            if w_o.shape[1] != n_kv * group * d:
                raise NotImplementedError(
                    f"The output projection of layer {layer} takes {w_o.shape[1]} inputs, not heads x value dim "
                    f"({n_kv * group} x {d}): the oracle cannot split it per query head."
                )
            heads = w_o.view(-1, n_kv, group, d).permute(1, 2, 0, 3)  # (H_kv, g, D, d): query head q = k*g + i
            self.grams[layer] = heads.transpose(-1, -2) @ heads
        return self.grams[layer]

    def _score(self, layer, query, key, value, scaling, softcap, sinks) -> tuple[torch.Tensor, torch.Tensor]:
        """(H_kv, C_k) KVzip and KVzip+ maxima of the scored context positions over the repeated queries."""
        n_q, n, d = query.shape
        n_kv, n_seq, _ = key.shape
        group = n_q // n_kv
        keys = key.float()
        out_norm = self._value_norms(layer, value[:, self.scored].float(), group)  # (H_kv, g, C_k)
        h = self.inputs[layer]
        key_pos = torch.arange(n_seq, device=key.device)
        sink = None if sinks is None else sinks.float().view(n_kv, group, 1, 1)
        kvzip = torch.zeros_like(out_norm)
        plus = torch.zeros_like(out_norm)
        for start in range(n - self.n_repeat, n, self.query_chunk):
            rows = slice(start, min(start + self.query_chunk, n))
            q = query[:, rows].float().view(n_kv, group, -1, d) * scaling  # (H_kv, g, c, d)
            logits = q @ keys[:, None].transpose(-1, -2)  # (H_kv, g, c, T)
            if softcap:
                logits = torch.tanh(logits / softcap) * softcap
            first = n_seq - n + rows.start  # key position of the chunk's first query: no earlier key is in its future
            future = key_pos[None, first:] > key_pos[first : n_seq - n + rows.stop, None]  # (c, T - first)
            logits[..., first:].masked_fill_(future, float("-inf"))
            if sink is None:
                attn = logits.softmax(dim=-1)
            else:  # the sink takes its share of the softmax and is not a key
                attn = torch.cat([logits, sink.expand(*logits.shape[:-1], 1)], dim=-1).softmax(dim=-1)[..., :-1]
            attn = attn[..., self.scored]  # (H_kv, g, c, C_k)
            kvzip = torch.maximum(kvzip, attn.amax(dim=2))
            h_norm = h[rows].float().norm(dim=-1)  # (c,)
            plus = torch.maximum(plus, attn.div_(h_norm[:, None]).amax(dim=2))  # attn is not read after
        plus = plus * out_norm  # max_j commutes with the j-independent positive factor ||W_O v_i||
        return kvzip.amax(dim=1), plus.amax(dim=1)


def _inner(module: nn.Module, implementation: str):
    """The attention function `implementation` names for this module (eager is each family's own function)."""
    if implementation == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[implementation]


def _oracle_attention(implementation: str):
    # transformers' calling convention for attention functions, dropout the sixth positional argument: kvpress wraps
    # every registered function at import and calls it that way (tests/test_oracle.py runs both orders)
    def attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        """Score (when an oracle is active), then compute the output as `implementation` does."""
        scorer = _ACTIVE.get()
        if scorer is not None and module in scorer.index:
            scale = query.shape[-1] ** -0.5 if scaling is None else scaling
            scorer.observe(module, query, key, value, scale, kwargs.get("softcap"), kwargs.get("s_aux"))
        inner = _inner(module, implementation)
        return inner(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)

    return attention


def _register(implementation: str) -> str:
    """Register (once) the oracle attention that computes its output with `implementation`, and its masks."""
    name = PREFIX + implementation
    if name not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, _oracle_attention(implementation))
        if implementation in ALL_MASK_ATTENTION_FUNCTIONS:  # else transformers builds no mask for either
            AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS[implementation])
    return name


@contextmanager
def scoring(model: PreTrainedModel, scorer: LayerScorer) -> Iterator[None]:
    """While active, every forward of `model` feeds `scorer`; the attention implementation is restored after."""
    original = model.config._attn_implementation
    name = _register(original)
    hooks = [m.register_forward_pre_hook(scorer.keep_input, with_kwargs=True) for m in scorer.index]
    token = _ACTIVE.set(scorer)
    try:
        model.set_attn_implementation(name)
        if model.config._attn_implementation != name:
            raise NotImplementedError(_refusal(model, "its attention implementation cannot be switched"))
        yield
    finally:
        _ACTIVE.reset(token)
        for hook in hooks:
            hook.remove()
        if model.config._attn_implementation != original:
            model.set_attn_implementation(original)
