"""kvpress's KVzipPress reads the chat template through a tokenizer it loads at every prompt; ours loads it once."""

from __future__ import annotations

import torch
from tests.tiny_models import TEXT, tiny_model, tiny_tokenizer
from transformers import AutoTokenizer, DynamicCache

from kvzap.evaluation import presses


def test_kvzip_loads_the_tokenizer_once_and_still_compresses(tmp_path, monkeypatch):
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    model = tiny_model("qwen3", vocab_size=len(tokenizer))
    model.config.name_or_path = str(tmp_path)
    loads = []
    real = AutoTokenizer.from_pretrained
    monkeypatch.setattr(presses.AutoTokenizer, "from_pretrained", lambda path: loads.append(path) or real(path))
    presses._tokenizer.cache_clear()
    ids = tokenizer.apply_chat_template([{"role": "user", "content": TEXT}], return_tensors="pt", return_dict=True)[
        "input_ids"
    ]
    masked = []
    for name in ("kvzip", "kvzip_plus", "kvzip"):
        press = presses.build(name, 0.5, {})
        with press(model), torch.no_grad():
            model.model(input_ids=ids, past_key_values=DynamicCache())
        c = model.config
        entries = c.num_hidden_layers * c.num_key_value_heads * ids.shape[1]
        masked.append(sum(len(layer.self_attn.masked_key_indices[0]) for layer in model.model.layers) / entries)
    assert loads == [str(tmp_path)]
    # each run still masks half of the entries (kvpress's KVzip scores the prompt and masks in place)
    assert all(abs(m - 0.5) < 0.01 for m in masked), masked
