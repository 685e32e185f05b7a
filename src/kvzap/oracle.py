"""KVzip and KVzip+ oracle scores: how much each context token is attended to when the model repeats it.

One forward pass of the decoder over `user: <ctx> Repeat the previous context exactly. assistant: <ctx>`.
A hook on every attention module recomputes, from the module's own projections, the queries of the
repeated copy and the keys of the whole prompt, and streams over chunks of repeated queries, so the model
keeps whatever attention implementation it was loaded with and peak extra memory per layer is
O(query_chunk x prompt length) instead of the full (heads x repeat x prompt) attention tensor.

For a context token i and a query j of the repeated copy (per query head, softmax over the whole prompt):
    KVzip   s_i  = max_j a_ji
    KVzip+  s+_i = max_j a_ji * ||W_O^h v_i|| / ||h_j||        (W_O^h: the o_proj columns of query head h)
then the max over the query heads of each GQA group; KVzip+ is returned as a natural log (the surrogates'
regression target).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

REPEAT_INSTRUCTION = "\n\nRepeat the previous context exactly."


@dataclass
class RepeatPrompt:
    input_ids: torch.Tensor  # (1, T)
    context: slice  # token span of the original context
    repeat: slice  # token span of its repetition


@dataclass
class OracleScores:
    kvzip: torch.Tensor  # (L, H_kv, C) attention weights in [0, 1]
    kvzip_plus_log: torch.Tensor  # (L, H_kv, C) natural log of KVzip+
    hidden: torch.Tensor | None  # (L, n, D) attention inputs at the requested context positions


def _char_span_to_tokens(offsets: list[tuple[int, int]], start: int, end: int) -> slice:
    inside = [i for i, (a, b) in enumerate(offsets) if b > a and a >= start and b <= end]
    if not inside:
        raise ValueError("The context did not survive tokenization as a contiguous token span.")
    return slice(inside[0], inside[-1] + 1)


def build_repeat_prompt(tokenizer: PreTrainedTokenizerBase, context: str) -> RepeatPrompt:
    """Render the repeat prompt with the model's chat template and locate both copies of the context."""
    messages = [
        {"role": "user", "content": context + REPEAT_INSTRUCTION},
        {"role": "assistant", "content": context},
    ]
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(messages, tokenize=False, enable_thinking=False)
    else:
        text = f"user: {messages[0]['content']}\nassistant: {context}"
    first = text.index(context)
    second = text.index(context, first + len(context))
    encoded = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    offsets = encoded["offset_mapping"]
    ctx = _char_span_to_tokens(offsets, first, first + len(context))
    rep = _char_span_to_tokens(offsets, second, second + len(context))
    return RepeatPrompt(torch.tensor([encoded["input_ids"]]), ctx, rep)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def _project(module: nn.Module, proj: nn.Linear, norm_name: str, h: torch.Tensor, cos, sin) -> torch.Tensor:
    """h: (T, D) -> RoPE'd heads (H, T, d), applying Qwen3-style per-head q/k norms when present."""
    x = proj(h).view(h.shape[0], -1, module.head_dim)
    norm = getattr(module, norm_name, None)
    if norm is not None:
        x = norm(x)
    x = x.transpose(0, 1).float()
    return x * cos + _rotate_half(x) * sin


class _LayerScorer:
    """Forward hook computing one layer's oracle scores from its attention input."""

    def __init__(self, prompt: RepeatPrompt, query_chunk: int, keep_positions: torch.Tensor | None):
        self.prompt, self.query_chunk, self.keep_positions = prompt, query_chunk, keep_positions
        self.kvzip: dict[int, torch.Tensor] = {}
        self.plus_log: dict[int, torch.Tensor] = {}
        self.hidden: dict[int, torch.Tensor] = {}

    @torch.no_grad()
    def __call__(self, module: nn.Module, args, kwargs, output):
        ctx, rep = self.prompt.context, self.prompt.repeat
        h = kwargs["hidden_states"][0]  # (T, D), batch of one
        cos, sin = (t[0].float() for t in kwargs["position_embeddings"])  # (T, d)
        n_q = module.config.num_attention_heads
        group = module.num_key_value_groups
        d = module.head_dim

        keys = _project(module, module.k_proj, "k_norm", h[: rep.stop], cos[: rep.stop], sin[: rep.stop])  # (Hkv, Tr, d)
        keys = keys.repeat_interleave(group, dim=0)  # (Hq, Tr, d), query head q reads kv head q // group
        values = module.v_proj(h[ctx]).view(-1, module.config.num_key_value_heads, d).float()  # (C, Hkv, d)
        values = values.repeat_interleave(group, dim=1)  # (C, Hq, d)
        w_o = module.o_proj.weight.float().view(-1, n_q, d)  # (D, Hq, d)
        out_norm = torch.einsum("chd,ehd->hce", values, w_o).norm(dim=-1)  # (Hq, C) = ||W_O^h v_i||

        kvzip = torch.zeros(n_q, ctx.stop - ctx.start, device=h.device)
        plus = torch.zeros_like(kvzip)
        positions = torch.arange(rep.stop, device=h.device)
        for start in range(rep.start, rep.stop, self.query_chunk):
            stop = min(start + self.query_chunk, rep.stop)
            q = _project(module, module.q_proj, "q_norm", h[start:stop], cos[start:stop], sin[start:stop])  # (Hq, c, d)
            logits = q @ keys.transpose(1, 2) * module.scaling  # (Hq, c, Tr)
            causal = positions[None, :] > positions[start:stop, None]  # (c, Tr)
            attn = logits.masked_fill(causal, float("-inf")).softmax(dim=-1)[..., ctx]  # (Hq, c, C)
            kvzip = torch.maximum(kvzip, attn.amax(dim=1))
            h_norm = h[start:stop].float().norm(dim=-1)  # (c,)
            plus = torch.maximum(plus, (attn / h_norm[None, :, None]).amax(dim=1))
        plus = plus * out_norm  # max_j commutes with the j-independent positive factor ||W_O v_i||

        n_kv = n_q // group
        layer = module.layer_idx
        self.kvzip[layer] = kvzip.view(n_kv, group, -1).amax(dim=1).cpu()
        self.plus_log[layer] = plus.view(n_kv, group, -1).amax(dim=1).log().cpu()
        if self.keep_positions is not None:
            self.hidden[layer] = h[ctx][self.keep_positions.to(h.device)].cpu()


def attention_modules(model: PreTrainedModel) -> list[nn.Module]:
    return [layer.self_attn for layer in model.model.layers]


@torch.no_grad()
def oracle_scores(
    model: PreTrainedModel,
    prompt: RepeatPrompt,
    keep_positions: torch.Tensor | None = None,
    query_chunk: int = 256,
) -> OracleScores:
    """Score every (layer, kv-head, context token); optionally keep the attention inputs at `keep_positions`
    (indices into the context span), which are the surrogate's training inputs."""
    scorer = _LayerScorer(prompt, query_chunk, keep_positions)
    handles = [m.register_forward_hook(scorer, with_kwargs=True) for m in attention_modules(model)]
    try:
        device = next(model.parameters()).device
        # The decoder alone: no LM head, no cache (the repeated copy's logits are never needed).
        model.model(input_ids=prompt.input_ids.to(device)[:, : prompt.repeat.stop], use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
    layers = sorted(scorer.kvzip)
    return OracleScores(
        kvzip=torch.stack([scorer.kvzip[i] for i in layers]),
        kvzip_plus_log=torch.stack([scorer.plus_log[i] for i in layers]),
        hidden=torch.stack([scorer.hidden[i] for i in layers]) if keep_positions is not None else None,
    )
