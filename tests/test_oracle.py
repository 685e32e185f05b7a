"""The KVzip / KVzip+ oracle against a plainly written computation from eager attention weights."""

import pytest
import torch
from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

from kvzap.oracle.scores import RepeatPrompt, build_repeat_prompt, oracle_scores
from oracle_reference import reference_scores
from tiny_models import TEXT, tiny_config, tiny_model, tiny_tokenizer

OTHER_FAMILIES = {"qwen2": (Qwen2Config, Qwen2ForCausalLM), "mistral": (MistralConfig, MistralForCausalLM)}
# MistralConfig defaults to a 4096 window, in which every layer slides (nothing for KVzap); v0.2+ ship none
NO_WINDOW = {"mistral": {"sliding_window": None}}
SHARED_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "max_position_embeddings",
    "eos_token_id",
    "pad_token_id",
    "bos_token_id",
    "tie_word_embeddings",
)


def family_model(family: str, vocab_size: int, kv_heads: int, attn: str = "sdpa"):
    """tiny_models' Llama/Qwen3, or a Qwen2 (q/k/v biases) / Mistral of the same shape; kv_heads=4 is MHA."""
    if family not in OTHER_FAMILIES:
        return tiny_model(family, vocab_size, attn=attn, num_key_value_heads=kv_heads)
    base = tiny_config("llama", vocab_size, num_key_value_heads=kv_heads)
    config_cls, model_cls = OTHER_FAMILIES[family]
    config = config_cls(**{k: getattr(base, k) for k in SHARED_FIELDS}, **NO_WINDOW.get(family, {}))
    config._attn_implementation = attn
    torch.manual_seed(0)
    return model_cls(config).eval().requires_grad_(False)


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "mistral"])
@pytest.mark.parametrize("kv_heads,query_chunk", [(2, 7), (4, 1024)])  # GQA, MHA
def test_oracle_matches_reference(family, kv_heads, query_chunk):
    tok = tiny_tokenizer()
    prompt = build_repeat_prompt(tok, TEXT[:300])
    model = family_model(family, len(tok), kv_heads)
    ours = oracle_scores(model, prompt, query_chunk=query_chunk)
    model.config._attn_implementation = "eager"
    ref_kvzip, ref_plus = reference_scores(model, prompt)
    assert ours.kvzip.shape == (2, kv_heads, prompt.context.stop - prompt.context.start)
    torch.testing.assert_close(ours.kvzip, ref_kvzip, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.kvzip_plus_log, ref_plus, atol=1e-5, rtol=1e-5)


def test_repeat_prompt_spans_hold_the_same_tokens():
    tok = tiny_tokenizer()
    prompt = build_repeat_prompt(tok, TEXT[:200])
    ids = prompt.input_ids[0]
    assert prompt.context.stop <= prompt.repeat.start
    assert ids[prompt.context].tolist() == ids[prompt.repeat].tolist()
    assert "Repeat the previous context exactly." in tok.decode(ids[prompt.context.stop : prompt.repeat.start])


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


CHUNK = 80  # TEXT[:600] is 211 context tokens: chunks of 80, 80 and 51


def plain_chunk_prompts(tok, prompt: RepeatPrompt, chunk: int) -> list[RepeatPrompt]:
    """KVzip's chunk prompts written out from the instruction texts, one full sequence per chunk."""
    ids, ctx, rep = prompt.input_ids[0], prompt.context, prompt.repeat
    opening = tok.encode("<|im_end|>\n<|im_start|>assistant\n")  # CHATML's end of user turn, assistant turn
    later = tok.encode("\n\nRepeat the part of the previous context exactly, starting with")
    context = ids[ctx].tolist()
    out = []
    for start in range(0, len(context), chunk):
        piece = context[start : start + chunk]
        lead = ids[ctx.stop : rep.start].tolist() if start == 0 else later + context[start - 8 : start] + opening
        seq = ids[: ctx.stop].tolist() + lead + piece
        out.append(
            RepeatPrompt(
                torch.tensor([seq]),
                slice(ctx.start + start, ctx.start + start + len(piece)),
                slice(len(seq) - len(piece), len(seq)),
            )
        )
    return out


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_chunked_oracle_matches_plain_per_chunk_computation(family):
    tok = tiny_tokenizer()
    prompt = build_repeat_prompt(tok, TEXT[:600])
    model = family_model(family, len(tok), kv_heads=2)
    ours = oracle_scores(model, prompt, query_chunk=16, chunk_tokens=CHUNK)
    model.config._attn_implementation = "eager"
    chunks = plain_chunk_prompts(tok, prompt, CHUNK)
    assert [c.context.stop - c.context.start for c in chunks] == [80, 80, 51]
    for chunk in chunks:
        ref_kvzip, ref_plus = reference_scores(model, chunk)
        local = slice(chunk.context.start - prompt.context.start, chunk.context.stop - prompt.context.start)
        torch.testing.assert_close(ours.kvzip[..., local], ref_kvzip, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.kvzip_plus_log[..., local], ref_plus, atol=1e-5, rtol=1e-5)


def test_chunking_changes_only_what_it_must():
    """A context of at most one chunk is the unchunked oracle bit for bit. With several chunks, chunk 0's
    queries see exactly the unchunked prompt's prefix, so its scores equal the oracle of the prompt cut after
    that chunk and are at most the unchunked ones (a max over fewer of the same rows); the hidden states of the
    context do not depend on chunking; later chunks, seen under another instruction, do change."""
    tok = tiny_tokenizer()
    prompt = build_repeat_prompt(tok, TEXT[:600])
    n_ctx = prompt.context.stop - prompt.context.start
    model = tiny_model("llama", len(tok))
    keep = torch.tensor([0, 100, 200])
    whole = oracle_scores(model, prompt, keep_positions=keep, chunk_tokens=None)
    one_chunk = oracle_scores(model, prompt, keep_positions=keep, chunk_tokens=n_ctx)
    assert torch.equal(one_chunk.kvzip, whole.kvzip) and torch.equal(one_chunk.kvzip_plus_log, whole.kvzip_plus_log)

    chunked = oracle_scores(model, prompt, keep_positions=keep, chunk_tokens=CHUNK)
    rep = prompt.repeat
    cut = RepeatPrompt(prompt.input_ids[:, : rep.start + CHUNK], prompt.context, slice(rep.start, rep.start + CHUNK))
    first = oracle_scores(model, cut, chunk_tokens=None)
    torch.testing.assert_close(chunked.kvzip[..., :CHUNK], first.kvzip[..., :CHUNK], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(
        chunked.kvzip_plus_log[..., :CHUNK], first.kvzip_plus_log[..., :CHUNK], atol=1e-6, rtol=1e-6
    )
    assert (chunked.kvzip[..., :CHUNK] <= whole.kvzip[..., :CHUNK] + 1e-6).all()
    assert (chunked.kvzip_plus_log[..., :CHUNK] <= whole.kvzip_plus_log[..., :CHUNK] + 1e-6).all()
    torch.testing.assert_close(chunked.hidden, whole.hidden)
    assert not torch.allclose(chunked.kvzip[..., CHUNK:], whole.kvzip[..., CHUNK:], atol=0, rtol=1e-3)


KVPRESS_AFTER_THE_ORACLE = """
import sys, torch
sys.path.insert(0, "tests")
from tiny_models import TEXT, tiny_model, tiny_tokenizer
from kvzap.oracle.scores import build_repeat_prompt, oracle_scores
assert "kvpress" not in sys.modules
tok = tiny_tokenizer()
model = tiny_model("llama", len(tok))
prompt = build_repeat_prompt(tok, TEXT[:200])
before = oracle_scores(model, prompt).kvzip_plus_log
import kvpress  # wraps every registered attention function, and calls them with dropout positional
from kvzap.pruning import KVzapPress  # the presses' attention too
after = oracle_scores(model, prompt).kvzip_plus_log
assert torch.equal(before, after), (before - after).abs().max()
print("same scores")
"""


def test_the_oracle_scores_the_same_before_and_after_kvpress_wraps_its_attention():
    """In one process, as a user would: the oracle, then `import kvpress` (which wraps every attention function
    registered so far), then the oracle again, which now runs through kvpress's wrapper."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    result = subprocess.run(
        [sys.executable, "-c", KVPRESS_AFTER_THE_ORACLE], cwd=root, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0 and "same scores" in result.stdout, result.stderr[-2000:]
