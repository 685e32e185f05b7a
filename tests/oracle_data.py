"""Oracle collections and training shards small enough for a unit test, shared by the collection, integrity and
ablation tests so that each checks the same data that kvzap.training writes."""

from __future__ import annotations

import json

import torch

from kvzap.training.collect import collect_split
from kvzap.training.corpus import Prompt
from kvzap.training.shards import write_shard
from tiny_models import TEXT, tiny_model, tiny_tokenizer

SETTINGS = {"test": 1}
RECORD = {"model_id": "tiny", "revision": "none"}


def tiny_prompts(n):
    return [Prompt("s", i, TEXT[i * 13 : i * 13 + 150]) for i in range(n)]


def collect_tiny(tmp_path, n_prompts=4):
    """Four prompts of 10 tokens in shards of 15 tokens: two shards, so resuming has a shard to skip and one to
    redo."""
    tok = tiny_tokenizer()
    model = tiny_model("llama", len(tok))
    return (
        collect_split(
            model,
            tok,
            tiny_prompts(n_prompts),
            tmp_path,
            SETTINGS,
            tokens_per_prompt=10,
            shard_tokens=15,
            seed=1,
            model_record=RECORD,
        ),
        model,
        tok,
    )


def synthetic_split(folder, n=600, layers=2, dim=12, heads=2, seed=0, shard=200, dtype=torch.float32):
    """Shards of y = x W - 6 + noise (prompt = row index), written as kvzap.training.collect writes them: a known
    linear target lets the fits be checked without running a model."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, layers, dim, generator=g) * 3 + 1
    w = torch.randn(layers, dim, heads, generator=g)
    y = torch.einsum("nld,ldh->nlh", x, w) - 6 + 0.3 * torch.randn(n, layers, heads, generator=g)
    rows = {"h": x.to(dtype), "y": y, "prompt": torch.arange(n)}
    write_split(
        folder, rows, shard, hidden_size=dim, n_kv_heads=heads, n_layers=layers, params_hash=f"synthetic-{seed}"
    )
    return x, y


def write_split(folder, rows, shard, **manifest):
    """`rows` cut into shards of `shard` rows, and a manifest of `manifest` after the shard list: the layout
    kvzap.training.collect leaves, for synthetic splits of any fields."""
    n = len(rows["prompt"])
    folder.mkdir(parents=True)
    shards = [
        write_shard(
            folder / f"shard-{i:05d}.safetensors", {name: row[start : start + shard] for name, row in rows.items()}
        )
        for i, start in enumerate(range(0, n, shard))
    ]
    (folder / "manifest.json").write_text(json.dumps({"shards": shards, **manifest}))
