"""What a per-token-slot engine (vLLM: a block holds every KV head of a token) can free of KVzap's pruning. KVzap keeps
a different number of tokens per (layer, KV head); an engine whose slots hold all heads must keep, per (request,
layer), n = the most any head keeps (the others keep their next-best entries), or, with one block table for all
layers, the most any (layer, head) keeps. Measured on the demo model with its trained surrogate at the demo's
thresholds, over RULER-style contexts: KVzap's own compression, and what survives each fill policy.

    python benchmarks/slot_fill.py --surrogate results/smollm2-135m/surrogates/mlp --out benchmarks/cpu/slot_fill.json

Prefill runs the pipeline's context (decoding=False); decoding runs `generate` under a decoding press over the same
contexts for --decode-tokens new tokens.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from transformers import pipeline

import ruler_rows
from kvzap.atomic import atomic_write_json
from kvzap.pruning import KVzapPress
from records import output_file, positive_int, print_table

COLUMNS = ["mode", "threshold", "kvzap_ratio", "per_layer_fill_ratio", "all_layers_fill_ratio", "max_over_mean"]
COLUMNS += ["per_head_sequences", "per_layer_sequences", "all_layers_sequences"]


def fills(kept: torch.Tensor) -> dict:
    """kept (layers, H): fraction of a sample's tokens kept -> the compression each policy realises."""
    per_layer = kept.max(-1).values  # (layers,): the slots a layer must hold
    return {
        "kvzap_ratio": 1 - kept.mean().item(),
        "per_layer_fill_ratio": 1 - per_layer.mean().item(),
        "all_layers_fill_ratio": 1 - kept.max().item(),
        "max_over_mean": (per_layer / kept.mean(-1)).mean().item(),
        "max_over_mean_by_layer": (per_layer / kept.mean(-1)).tolist(),
    }


def mean_record(records: list[dict]) -> dict:
    keys = ["kvzap_ratio", "per_layer_fill_ratio", "all_layers_fill_ratio", "max_over_mean"]
    out = {k: sum(r[k] for r in records) / len(records) for k in keys}
    # sequences held at a fixed KV memory, against the dense cache: 1 / the fraction of slots each layout keeps
    for layout, ratio in (
        ("per_head", "kvzap_ratio"),
        ("per_layer", "per_layer_fill_ratio"),
        ("all_layers", "all_layers_fill_ratio"),
    ):
        out[f"{layout}_sequences"] = 1 / (1 - out[ratio])
    layers = len(records[0]["max_over_mean_by_layer"])
    out["max_over_mean_by_layer"] = [
        sum(r["max_over_mean_by_layer"][i] for r in records) / len(records) for i in range(layers)
    ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ruler_rows.add_arguments(parser, "512", ["niah_single_2"], 30)
    parser.add_argument("--surrogate", type=Path, required=True)
    parser.add_argument("--thresholds", type=float, nargs="+", default=[-2.6, -1.6, -1.0])
    parser.add_argument("--decode-tokens", type=positive_int, default=64)
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args()
    model, tokenizer, _, rows = ruler_rows.model_and_rows(args)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device=model.device)
    records = []
    for tau in args.thresholds:
        prefill, decoding = [], []
        for row in rows.itertuples():
            press = KVzapPress(str(args.surrogate), threshold=tau)
            pipe(row.context, question=row.question, press=press, max_new_tokens=1)
            prefill.append(fills(1 - press.head_ratio_table))
            press = KVzapPress(str(args.surrogate), threshold=tau, decoding=True)
            ids = tokenizer(row.context + row.question, return_tensors="pt").input_ids
            with torch.no_grad(), press(model):
                model.generate(
                    ids, max_new_tokens=args.decode_tokens, do_sample=False, min_new_tokens=args.decode_tokens
                )
            decoding.append(fills(1 - press.head_ratio_table))
        for mode, samples in (("prefill", prefill), ("decoding", decoding)):
            records.append({"mode": mode, "threshold": tau, "samples": len(samples), **mean_record(samples)})
            print_table(records[-1:], COLUMNS)
    print_table(records, COLUMNS)
    atomic_write_json(args.out, {"surrogate": str(args.surrogate), "records": records})


if __name__ == "__main__":
    main()
