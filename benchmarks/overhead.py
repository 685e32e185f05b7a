"""The surrogate's cost relative to one decoder layer: FLOPs (paper Table 3) and, on the small model, time.

FLOPs per token and layer come from kvzap.report.flops (paper App. B). Time is measured on the offline small
model (one decoder layer vs the surrogate on the same hidden states, same run); the 8B/32B models are FLOPs
only, from their Hub config values written below.

    python benchmarks/overhead.py --out results/overhead.json [--tokens 512]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import torch
from transformers.utils import logging

from kvzap.atomic import atomic_write_json
from kvzap.prepare.models import ensure_prepared, load
from kvzap.report.flops import LayerShape, mlp_hidden, share
from kvzap.surrogate.model import Surrogate
from records import output_file, positive_int

# From each model's config.json on the Hub (paper Table 3).
CONFIGS = {
    "Qwen/Qwen3-8B": LayerShape(H_Q=32, H=8, D=128, D_h=4096, D_int=12288),
    "meta-llama/Llama-3.1-8B-Instruct": LayerShape(H_Q=32, H=8, D=128, D_h=4096, D_int=14336),
    "Qwen/Qwen3-32B": LayerShape(H_Q=64, H=8, D=128, D_h=5120, D_int=25600),
}
SMALL_MODEL = "offline/SmolLM2-135M-Instruct"


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
    parser.add_argument("--out", type=output_file, required=True)
    parser.add_argument("--model-json", type=Path, default=Path(".cache/smollm2/model.json"))
    parser.add_argument("--tokens", type=positive_int, default=512, help="tokens per timed forward")
    parser.add_argument("--repeats", type=positive_int, default=20)
    parser.add_argument("--threads", type=positive_int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()

    ensure_prepared(args.model_json, SMALL_MODEL)
    model, _ = load(args.model_json, dtype="float32", device_map="cpu")
    small = LayerShape.from_hf_config(model.config.to_dict())

    records = []
    for name, shape in [(SMALL_MODEL, small), *CONFIGS.items()]:
        for kind, hidden in (("linear", None), ("mlp", mlp_hidden(shape))):
            flops_share = share(shape, kind)
            record = {
                "model": name,
                "surrogate": kind,
                "flops_share": flops_share,
                "time_share": None,
                "mlp_hidden": hidden,
            }
            if name == SMALL_MODEL:
                surrogate = Surrogate(shape.D_h, shape.H, model.config.num_hidden_layers, hidden).eval()
                record["time_share"] = measured_share(model, surrogate, args.tokens, args.repeats)
                record["timed_tokens"] = args.tokens
            records.append(record)
            time_share = "-" if record["time_share"] is None else f"{100 * record['time_share']:.3f} %"
            print(f"{name:34s} {kind:6s} FLOPs {100 * flops_share:.3f} %  time {time_share}", flush=True)
    atomic_write_json(args.out, records)


if __name__ == "__main__":
    main()
