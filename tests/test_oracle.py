"""The KVzip / KVzip+ oracle against a plainly written computation from eager attention weights."""

import pytest
import torch

from kvzap.oracle import build_repeat_prompt, oracle_scores
from tiny_models import TEXT, tiny_model, tiny_tokenizer


def reference_scores(model, prompt):
    """Explicit softmax(QK^T) from eager attention, GQA expansion, per-head ||W_O v||: no shared code."""
    ids = prompt.input_ids[:, : prompt.repeat.stop]
    captured = {}

    def grab(i):
        def hook(module, args, kwargs):
            captured[i] = kwargs["hidden_states"][0].clone()
        return hook

    handles = [layer.self_attn.register_forward_pre_hook(grab(i), with_kwargs=True) for i, layer in enumerate(model.model.layers)]
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
            vnorm[head] = (v_head @ wo[:, head * d:(head + 1) * d].T).norm(dim=-1)
        hnorm = h[rep].norm(dim=-1)  # (R,)
        s = a.amax(dim=1)
        sp = (a * vnorm[:, None, :] / hnorm[None, :, None]).amax(dim=1)
        kvzip.append(s.view(n_kv, g, -1).amax(1))
        plus.append(sp.view(n_kv, g, -1).amax(1).log())
    return torch.stack(kvzip), torch.stack(plus)


@pytest.mark.parametrize("family", ["llama", "qwen3"])
@pytest.mark.parametrize("query_chunk", [7, 1024])
def test_oracle_matches_reference(family, query_chunk):
    tok = tiny_tokenizer()
    prompt = build_repeat_prompt(tok, TEXT[:300])
    model = tiny_model(family, len(tok), attn="sdpa")
    ours = oracle_scores(model, prompt, query_chunk=query_chunk)
    model.config._attn_implementation = "eager"
    ref_kvzip, ref_plus = reference_scores(model, prompt)
    assert ours.kvzip.shape == (2, 2, prompt.context.stop - prompt.context.start)
    torch.testing.assert_close(ours.kvzip, ref_kvzip, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.kvzip_plus_log, ref_plus, atol=1e-5, rtol=1e-5)


def test_repeat_prompt_spans_hold_the_same_tokens():
    tok = tiny_tokenizer()
    prompt = build_repeat_prompt(tok, TEXT[:200])
    ids = prompt.input_ids[0]
    assert prompt.context.stop <= prompt.repeat.start
    assert ids[prompt.context].tolist() == ids[prompt.repeat].tolist()
    assert "Repeat the previous context exactly." in tok.decode(ids[prompt.context.stop:prompt.repeat.start])


def test_hidden_states_kept_at_requested_positions():
    tok = tiny_tokenizer()
    prompt = build_repeat_prompt(tok, TEXT[:200])
    model = tiny_model("llama", len(tok))
    positions = torch.tensor([0, 3, 5])
    out = oracle_scores(model, prompt, keep_positions=positions)
    captured = {}

    def grab(module, args, kwargs):
        captured["h"] = kwargs["hidden_states"][0].clone()

    handle = model.model.layers[1].self_attn.register_forward_pre_hook(grab, with_kwargs=True)
    model(prompt.input_ids)
    handle.remove()
    torch.testing.assert_close(out.hidden[1], captured["h"][prompt.context][positions])
