"""Oracle scores written out independently of kvzap.oracle (eager attention weights, cached values, W_O), kept
apart from the tests so that every oracle test compares against the same plain computation."""

from __future__ import annotations

import torch
from transformers import DynamicCache


def reference_scores(model, prompt):
    """Explicit softmax(QK^T) from eager attention, GQA expansion, per-head ||W_O v||: no shared code."""
    ids = prompt.input_ids[:, : prompt.repeat.stop]
    captured = {}

    def grab(i):
        def hook(module, args, kwargs):
            captured[i] = kwargs["hidden_states"][0].clone()

        return hook

    handles = [
        layer.self_attn.register_forward_pre_hook(grab(i), with_kwargs=True)
        for i, layer in enumerate(model.model.layers)
    ]
    out = model(ids, output_attentions=True, use_cache=False)
    for handle in handles:
        handle.remove()
    cfg = model.config
    n_q, n_kv, d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    g = n_q // n_kv
    ctx, rep = prompt.context, prompt.repeat
    kvzip, plus = [], []
    for i, layer in enumerate(model.model.layers):
        a = out.attentions[i][0]  # (Hq, T, T)
        a = a[:, rep, :][:, :, ctx]  # (Hq, R, C)
        h = captured[i]
        v = layer.self_attn.v_proj(h).view(-1, n_kv, d)  # (T, Hkv, d)
        wo = layer.self_attn.o_proj.weight  # (D, Hq*d)
        vnorm = torch.empty(n_q, ctx.stop - ctx.start)
        for head in range(n_q):
            v_head = v[ctx, head // g, :]  # (C, d)
            vnorm[head] = (v_head @ wo[:, head * d : (head + 1) * d].T).norm(dim=-1)
        hnorm = h[rep].norm(dim=-1)  # (R,)
        s = a.amax(dim=1)
        sp = (a * vnorm[:, None, :] / hnorm[None, :, None]).amax(dim=1)
        kvzip.append(s.view(n_kv, g, -1).amax(1))
        plus.append(sp.view(n_kv, g, -1).amax(1).log())
    return torch.stack(kvzip), torch.stack(plus)


def _output_weight(attention) -> torch.Tensor:
    return next(getattr(attention, n).weight for n in ("o_proj", "dense", "out_proj") if hasattr(attention, n))


def eager_log_kvzip_plus(model, prompt) -> tuple[torch.Tensor, torch.Tensor]:
    """(L, H_kv, C) log KVzip+ from eager attention weights of the full repeat prompt, cached values, W_O and
    hooked attention inputs: max over repeated queries of a_ji ||W_O^h v_i|| / ||h_j||, then over the group;
    and the (L, T, D) attention inputs."""
    model.set_attn_implementation("eager")
    layers = model.base_model.layers
    attentions = [getattr(layer, "self_attn", None) or layer.attention for layer in layers]
    inputs = {}

    def keep(i):
        def hook(module, args, kwargs):
            inputs[i] = (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0])[0]

        return hook

    hooks = [a.register_forward_pre_hook(keep(i), with_kwargs=True) for i, a in enumerate(attentions)]
    cache = DynamicCache()
    out = model(prompt.input_ids[:, : prompt.repeat.stop], past_key_values=cache, output_attentions=True)
    for hook in hooks:
        hook.remove()
    ctx, rep = prompt.context, prompt.repeat
    result = []
    for i, attention in enumerate(attentions):
        weights = out.attentions[i][0][:, rep, ctx]  # (Hq, R, C)
        values = cache.layers[i].values[0, :, ctx]  # (Hkv, C, dv)
        n_q, n_kv, dv = weights.shape[0], values.shape[0], values.shape[-1]
        w_o = _output_weight(attention)
        v_out = torch.stack([values[h * n_kv // n_q] @ w_o[:, h * dv : (h + 1) * dv].T for h in range(n_q)])
        plus = weights * v_out.norm(dim=-1)[:, None, :] / inputs[i][rep].norm(dim=-1)[None, :, None]
        result.append(plus.amax(dim=1).view(n_kv, n_q // n_kv, -1).amax(dim=1).log())
    return torch.stack(result), torch.stack([inputs[i] for i in range(len(attentions))])
