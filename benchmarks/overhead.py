"""The surrogate's cost relative to one decoder layer: FLOPs (paper Table 3) and, on the small model, time.

FLOPs per token and layer, linear projections only (paper App. B): C = 4*D_h*(H_Q*D + H*D) + 6*D_h*D_int,
C_MLP = 2*D_h*h + 2*h*H with h = D_h/8 (= (D_h/4)*(D_h + H)), C_Linear = 2*D_h*H. Time is measured on the
offline small model (one decoder layer vs the surrogate on the same hidden states, same run); the 8B/32B
models are FLOPs only, from their Hub config values written below.

    python benchmarks/overhead.py --out results/overhead.json [--tokens 512]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers.utils import logging

from kvzap.io import atomic_write_json
from kvzap.models import ensure_prepared, load
from kvzap.surrogate import Surrogate

# (hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size) from each config.json.
CONFIGS = {
    "Qwen/Qwen3-8B": (4096, 32, 8, 128, 12288),
    "meta-llama/Llama-3.1-8B-Instruct": (4096, 32, 8, 128, 14336),
    "Qwen/Qwen3-32B": (5120, 64, 8, 128, 25600),
}
SMALL_MODEL = "offline/SmolLM2-135M-Instruct"


def layer_flops(hidden, q_heads, kv_heads, head_dim, intermediate) -> int:
    return 4 * hidden * (q_heads * head_dim + kv_heads * head_dim) + 6 * hidden * intermediate


def surrogate_flops(hidden, kv_heads, mlp_hidden: int | None) -> int:
    return 2 * hidden * kv_heads if mlp_hidden is None else 2 * hidden * mlp_hidden + 2 * mlp_hidden * kv_heads


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


@torch.no_grad()
def measured_share(model, surrogate: Surrogate, tokens: int, repeats: int) -> float:
    """Time of the surrogate over `tokens` attention inputs / time of decoder layer 0 over the same tokens."""
    hidden = torch.randn(1, tokens, model.config.hidden_size)
    positions = torch.arange(tokens)[None]
    embeddings = model.model.rotary_emb(hidden, positions)
    layer = model.model.layers[0]
    t_layer = median_seconds(lambda: layer(hidden, position_embeddings=embeddings, position_ids=positions), repeats)
    normed = layer.input_layernorm(hidden)
    t_surrogate = median_seconds(lambda: surrogate.score_layer(0, normed), repeats)
    return t_surrogate / t_layer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model-json", type=Path, default=Path(".cache/smollm2/model.json"))
    parser.add_argument("--tokens", type=int, default=512, help="tokens per timed forward")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()

    ensure_prepared(args.model_json, SMALL_MODEL)
    model, _ = load(args.model_json, dtype="float32", device_map="cpu")
    c = model.config
    small = (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim, c.intermediate_size)

    records = []
    for name, dims in [(SMALL_MODEL, small), *CONFIGS.items()]:
        hidden, _, kv_heads, _, _ = dims
        for kind, mlp_hidden in (("linear", None), ("mlp", hidden // 8)):
            share = surrogate_flops(hidden, kv_heads, mlp_hidden) / layer_flops(*dims)
            record = {"model": name, "surrogate": kind, "flops_share": share, "time_share": None,
                      "mlp_hidden": mlp_hidden}
            if name == SMALL_MODEL:
                surrogate = Surrogate(hidden, kv_heads, c.num_hidden_layers, mlp_hidden).eval()
                record["time_share"] = measured_share(model, surrogate, args.tokens, args.repeats)
                record["timed_tokens"] = args.tokens
            records.append(record)
            time_share = "-" if record["time_share"] is None else f"{100 * record['time_share']:.3f} %"
            print(f"{name:34s} {kind:6s} FLOPs {100 * share:.3f} %  time {time_share}", flush=True)
    atomic_write_json(args.out, records)


if __name__ == "__main__":
    main()
