"""kvpress's PyramidKV leaves layers of different lengths; the "kvzap" attention serves each with its own mask."""

from __future__ import annotations

import pytest
import torch
from tests.tiny_models import TEXT, tiny_model, tiny_tokenizer
from transformers import pipeline

from kvzap.evaluation import methods, presses
from kvzap.pruning.attention import kvzap_attention


def test_a_shorter_layer_reads_the_last_columns_of_the_shared_mask():
    torch.manual_seed(0)
    heads, kv_heads, dim, new, long_past, short_past = 4, 2, 8, 3, 10, 4
    query = torch.randn(1, heads, new, dim)
    key, value = torch.randn(2, 1, kv_heads, short_past + new, dim)
    causal = torch.ones(new, new).tril().bool()
    shared = torch.cat([torch.ones(new, long_past, dtype=torch.bool), causal], dim=1)[None, None]  # longest layer's
    own = torch.cat([torch.ones(new, short_past, dtype=torch.bool), causal], dim=1)[None, None]  # this layer's
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal, module.training = heads // kv_heads, True, False
    out, _ = kvzap_attention(module, query, key, value, shared)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, key.repeat_interleave(2, dim=1), value.repeat_interleave(2, dim=1), attn_mask=own
    )
    torch.testing.assert_close(out, expected.transpose(1, 2))


@pytest.mark.parametrize("family", ["qwen3", "llama"])
def test_pyramidkv_answers_a_question_after_pruning(family):
    assert methods.METHODS["pyramidkv"].attn_implementation == "kvzap"
    tokenizer = tiny_tokenizer()
    model = tiny_model(family, vocab_size=len(tokenizer), attn="kvzap")
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    press = presses.build("pyramidkv", 0.5, {})
    answer = pipe(TEXT, question="What is the special magic number?", press=press, max_new_tokens=4)["answer"]
    assert isinstance(answer, str)
