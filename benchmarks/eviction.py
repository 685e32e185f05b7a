"""Physical eviction vs the full cache vs kvpress's DMSPress masking: held KV bytes and decode step time.

All three run in the same process on the same context (offline SmolLM2-135M by default, one copy each),
prefill it, then greedy-decode `--decode-steps` tokens with decoding-time pruning on, steps interleaved.
The threshold for each target ratio is calibrated on a separate text. Without `--surrogate`, a seeded
random linear surrogate scores tokens: enough for memory and speed, not for answer quality.

    python benchmarks/eviction.py --out results/eviction.json [--contexts 2048 4096 8192] [--ratios 0.5 0.75]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import statistics
import time
from pathlib import Path

import torch
from kvpress import DMSPress
from transformers import DynamicCache
from transformers.utils import logging

from kvzap.atomic import atomic_write_json
from kvzap.prepare.models import ensure_prepared, load
from kvzap.pruning import KVzapPress, SurrogateScorerPress, held_kv_bytes
from kvzap.pruning.calibration import collect_scores, threshold_for
from kvzap.surrogate.model import Surrogate
from records import nonnegative_int, output_file, positive_int, print_table, unit_fraction

COLUMNS = [
    "context_tokens",
    "compression_ratio",
    "bytes_vs_full",
    "bytes_vs_masking",
    "decode_ms_vs_full",
    "decode_ms_vs_masking",
    "same_tokens_as_masking",
]

DEFAULT_MODEL = "offline/SmolLM2-135M-Instruct"


def offline_text() -> str:
    """A long, fixed, offline text: the source of a few standard-library modules."""
    import argparse as a
    import dataclasses as d
    import inspect as i
    import json.decoder as j
    import logging as lg
    import pathlib as p
    import typing as t

    return "\n".join(inspect.getsource(m) for m in (a, d, i, j, lg, p, t))


def mask_index_bytes(model) -> int:
    """kvpress's masking keeps (batch, head, position) index tensors on each attention module."""
    return sum(sum(t.nbytes for t in layer.self_attn.masked_key_indices or []) for layer in model.model.layers)


@torch.no_grad()
def decode_side_by_side(models: dict, presses: dict, ids: torch.Tensor, steps: int) -> dict:
    """Prefill each method on its own model copy, then greedy-decode with the methods' steps interleaved,
    so that load from other processes hits all of them alike. Median step time and bytes held at the end."""
    with contextlib.ExitStack() as stack:
        caches, logits, times, tokens = {}, {}, {}, {}
        for name, model in models.items():
            if presses[name] is not None:
                stack.enter_context(presses[name](model))
            caches[name], times[name], tokens[name] = DynamicCache(), [], []
            logits[name] = model(ids, past_key_values=caches[name], logits_to_keep=1).logits
        for _ in range(steps):
            for name, model in models.items():
                token = logits[name][:, -1].argmax(-1, keepdim=True)
                tokens[name].append(token.item())
                start = time.perf_counter()
                logits[name] = model(token, past_key_values=caches[name], logits_to_keep=1).logits
                times[name].append(time.perf_counter() - start)
    return {
        name: {
            "bytes": held_kv_bytes(caches[name]) + mask_index_bytes(models[name]),
            "decode_ms": 1000 * statistics.median(times[name][2:]),
            "tokens": tokens[name],
            "ratio": presses[name].compression_ratio if presses[name] is not None else 0.0,
        }
        for name in models
    }


def add_model_json(parser: argparse.ArgumentParser) -> None:
    """--model-json: the demo model's model.json, prepared from DEFAULT_MODEL on first use."""
    parser.add_argument(
        "--model-json",
        type=Path,
        default=Path(".cache/smollm2/model.json"),
        help=f"prepared model (prepared from {DEFAULT_MODEL} if missing)",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=output_file, required=True)
    add_model_json(parser)
    parser.add_argument("--surrogate", default=None, help="surrogate folder or Hub id (default: random linear)")
    parser.add_argument("--contexts", type=positive_int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--ratios", type=unit_fraction, nargs="+", default=[0.5, 0.75])
    parser.add_argument("--decode-steps", type=positive_int, default=32)
    parser.add_argument("--window", type=nonnegative_int, default=128)
    parser.add_argument("--threads", type=positive_int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()

    ensure_prepared(args.model_json, DEFAULT_MODEL)
    # One copy per method: kvpress masking keeps state on the attention modules, ours selects its attention.
    loaded = {
        name: load(args.model_json, dtype="float32", device_map="cpu") for name in ("full", "masking", "eviction")
    }
    models = {name: model for name, (model, _) in loaded.items()}
    model, tokenizer = loaded["eviction"]
    if args.surrogate:
        surrogate = Surrogate.from_pretrained(args.surrogate)
    else:
        torch.manual_seed(0)
        c = model.config
        surrogate = Surrogate(c.hidden_size, c.num_key_value_heads, c.num_hidden_layers)
    scorer = SurrogateScorerPress(surrogate=surrogate)

    ids = tokenizer(offline_text(), return_tensors="pt").input_ids
    calibration_ids, ids = ids[:, :2048], ids[:, 2048:]
    if ids.shape[1] < max(args.contexts):
        raise SystemExit(f"the offline text has {ids.shape[1]} tokens, fewer than {max(args.contexts)}")
    samples = collect_scores(model, [calibration_ids], scorer, args.window)
    thresholds = {r: threshold_for(samples, r) for r in args.ratios}
    print("calibrated thresholds:", {r: round(t, 4) for r, t in thresholds.items()}, flush=True)

    records = []
    for n in args.contexts:
        for ratio in args.ratios:
            presses = {
                "full": None,
                "masking": DMSPress(
                    scorer, threshold=thresholds[ratio], sliding_window_size=args.window, decoding=True
                ),
                "eviction": KVzapPress(scorer, threshold=thresholds[ratio], window=args.window, decoding=True),
            }
            m = decode_side_by_side(models, presses, ids[:, :n], args.decode_steps)
            full, masking, ours = m["full"], m["masking"], m["eviction"]
            records.append(
                {
                    "context_tokens": n,
                    "target_ratio": ratio,
                    "threshold": thresholds[ratio],
                    "compression_ratio": ours["ratio"],
                    "masking_compression_ratio": masking["ratio"],
                    "bytes_vs_full": ours["bytes"] / full["bytes"],
                    "bytes_vs_masking": ours["bytes"] / masking["bytes"],
                    "decode_ms_vs_full": ours["decode_ms"] / full["decode_ms"],
                    "decode_ms_vs_masking": ours["decode_ms"] / masking["decode_ms"],
                    "bytes": {k: v["bytes"] for k, v in m.items()},
                    "decode_ms": {k: v["decode_ms"] for k, v in m.items()},
                    "same_tokens_as_masking": ours["tokens"] == masking["tokens"],
                    "decode_steps": args.decode_steps,
                    "window": args.window,
                    "threads": args.threads,
                }
            )
            print(
                f"[{n} tokens, target {ratio}] achieved {ours['ratio']:.3f}; MiB / ms per step: "
                + ", ".join(f"{k} {v['bytes'] / 2**20:.1f} / {v['decode_ms']:.1f}" for k, v in m.items()),
                flush=True,
            )
    atomic_write_json(args.out, records)
    print_table(records, COLUMNS)


if __name__ == "__main__":
    main()
