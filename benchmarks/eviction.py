"""Physical eviction vs the full cache vs kvpress's DMSPress masking: held KV bytes and decode step time.

All three run in the same process on the same context (offline SmolLM2-135M by default), prefill the
context, then greedy-decode `--decode-steps` tokens with decoding-time pruning on. The threshold for each
target ratio is calibrated on a separate text. Without `--surrogate`, a seeded random linear surrogate
scores tokens: enough for memory and speed, not for answer quality.

    python benchmarks/eviction.py --out results/eviction.json [--contexts 2048 4096 8192] [--ratios 0.5 0.75]
"""

from __future__ import annotations

import argparse
import inspect
import statistics
import time
from pathlib import Path

import torch
from kvpress import DMSPress
from transformers import DynamicCache
from transformers.utils import logging

from kvzap.io import atomic_write_json
from kvzap.models import load, prepare
from kvzap.pruning import KVzapPress, SurrogateScorerPress
from kvzap.pruning.calibration import collect_scores, threshold_for
from kvzap.surrogate import Surrogate

DEFAULT_MODEL = "offline/SmolLM2-135M-Instruct"


def offline_text() -> str:
    """A long, fixed, offline text: the source of a few standard-library modules."""
    import argparse as a, dataclasses as d, inspect as i, json.decoder as j, logging as lg, pathlib as p, typing as t

    return "\n".join(inspect.getsource(m) for m in (a, d, i, j, lg, p, t))


def cache_bytes(cache) -> int:
    """Bytes of KV storage held by a cache: dense tensors, or a pruned layer's own accounting."""
    return sum(layer.nbytes if hasattr(layer, "nbytes") else layer.keys.nbytes + layer.values.nbytes
               for layer in cache.layers)


def mask_index_bytes(model) -> int:
    """kvpress's masking keeps (batch, head, position) index tensors on each attention module."""
    return sum(sum(t.nbytes for t in layer.self_attn.masked_key_indices or []) for layer in model.model.layers)


@torch.no_grad()
def run(model, ids: torch.Tensor, press, steps: int) -> dict:
    """Prefill under `press`, then greedy-decode `steps` tokens; median step time and held bytes at the end."""
    cache, times, tokens = DynamicCache(), [], []
    for layer in model.model.layers:  # forget a previous kvpress masking run
        layer.self_attn.masked_key_indices = None
    with press(model) if press is not None else torch.no_grad():
        logits = model(ids, past_key_values=cache, logits_to_keep=1).logits
        for _ in range(steps):
            token = logits[:, -1].argmax(-1, keepdim=True)
            tokens.append(token.item())
            start = time.perf_counter()
            logits = model(token, past_key_values=cache, logits_to_keep=1).logits
            times.append(time.perf_counter() - start)
    held = cache_bytes(cache) + mask_index_bytes(model)
    return {"bytes": held, "decode_ms": 1000 * statistics.median(times[2:]), "tokens": tokens,
            "ratio": press.compression_ratio if press is not None else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model-json", type=Path, default=Path(".cache/smollm2/model.json"),
                        help=f"prepared model (prepared from {DEFAULT_MODEL} if missing)")
    parser.add_argument("--surrogate", default=None, help="surrogate folder or Hub id (default: random linear)")
    parser.add_argument("--contexts", type=int, nargs="+", default=[2048, 4096, 8192])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.75])
    parser.add_argument("--decode-steps", type=int, default=32)
    parser.add_argument("--window", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    logging.disable_progress_bar()

    if not args.model_json.exists():
        print(f"preparing {DEFAULT_MODEL} into {args.model_json.parent}", flush=True)
        prepare(DEFAULT_MODEL, args.model_json.parent)
    model, tokenizer = load(args.model_json, dtype="float32", device_map="cpu")
    if args.surrogate:
        surrogate = Surrogate.from_pretrained(args.surrogate)
    else:
        torch.manual_seed(0)
        surrogate = Surrogate(model.config.hidden_size, model.config.num_key_value_heads, model.config.num_hidden_layers)
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
        context = ids[:, :n]
        full = run(model, context, None, args.decode_steps)
        print(f"[{n}] full cache: {full['bytes'] / 2**20:.1f} MiB, {full['decode_ms']:.1f} ms/step", flush=True)
        for ratio in args.ratios:
            dms = DMSPress(scorer, threshold=thresholds[ratio], sliding_window_size=args.window, decoding=True)
            masking = run(model, context, dms, args.decode_steps)
            ours = run(model, context, KVzapPress(scorer, threshold=thresholds[ratio], window=args.window,
                                                  decoding=True), args.decode_steps)
            records.append({
                "context_tokens": n, "target_ratio": ratio, "threshold": thresholds[ratio],
                "compression_ratio": ours["ratio"], "masking_compression_ratio": masking["ratio"],
                "bytes_vs_full": ours["bytes"] / full["bytes"], "bytes_vs_masking": ours["bytes"] / masking["bytes"],
                "decode_ms_vs_full": ours["decode_ms"] / full["decode_ms"],
                "decode_ms_vs_masking": ours["decode_ms"] / masking["decode_ms"],
                "bytes": {"full": full["bytes"], "masking": masking["bytes"], "eviction": ours["bytes"]},
                "decode_ms": {"full": full["decode_ms"], "masking": masking["decode_ms"], "eviction": ours["decode_ms"]},
                "same_tokens_as_masking": ours["tokens"] == masking["tokens"],
                "decode_steps": args.decode_steps, "window": args.window, "threads": args.threads,
            })
            print(f"[{n}] ratio {ratio}: achieved {ours['ratio']:.3f}, eviction "
                  f"{ours['bytes'] / 2**20:.1f} MiB {ours['decode_ms']:.1f} ms/step, masking "
                  f"{masking['bytes'] / 2**20:.1f} MiB {masking['decode_ms']:.1f} ms/step", flush=True)
    atomic_write_json(args.out, records)
    print_table(records)


def print_table(records: list[dict]) -> None:
    keys = ["context_tokens", "compression_ratio", "bytes_vs_full", "bytes_vs_masking", "decode_ms_vs_full",
            "decode_ms_vs_masking", "same_tokens_as_masking"]
    print(" | ".join(keys))
    for r in records:
        print(" | ".join(f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in keys))


if __name__ == "__main__":
    main()
