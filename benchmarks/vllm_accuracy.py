"""Accuracy through the engine: the demo's RULER-style rows, prompted exactly as the demo prompts them (kvpress's
pipeline: the chat-templated context, then the question, the end of the user turn and the answer prefix), answered
greedily by dense vLLM and by vLLM with the KVzap plugin at each threshold, scored with the demo's scorer and 95 %
intervals. Beside each: the plugin's compression (its fill policy, per layer) as `KVzapLayerFillPress` measures it
in transformers on the same prompts, and KVzap's own per-head ratio. The headline threshold of a surrogate is the
highest whose accuracy stays inside the dense engine's interval. `--layout per_head` serves the plugin's per-(layer,
KV head) layout instead, which prunes by KVzap's own ratio (no fill), so it needs a threshold of its own;
`--judge-chunks` with `--max-num-batched-tokens` judges each prefill chunk as vLLM's chunked prefill computes it,
which changes what later chunks attend to, so it too needs its own. Each engine runs in .venv-vllm
(`make setup-vllm`).

    cd benchmarks && python vllm_accuracy.py --model-json <demo>/model.json \
        --surrogate linear=<demo>/surrogates/linear --surrogate mlp=<demo>/surrogates/mlp --out cpu/vllm_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import platform
from pathlib import Path

import torch

import ruler_rows
from kvzap.atomic import atomic_write_json
from kvzap.pruning import KVzapLayerFillPress, KVzapPress
from kvzap.surrogate.model import resolve_folder
from records import cpu_flags, output_file, positive_int, print_table
from vllm_runs import add_engine_folder_argument, answers, demo_prompts, engine_folder, run_engine

COLUMNS = ["surrogate", "threshold", "score", "score_ci", "fill_ratio", "kvzap_ratio", "inside_dense_interval"]


def scored(bench, rows, texts: list[str]) -> dict:
    predictions = rows.drop(columns=["context"]).assign(prediction=texts)
    return bench.score(predictions)


def mean_ratio(model, prompts: list[list[int]], press) -> float:
    """A press's compression ratio over the prompts (a prefill of each, in transformers)."""
    ratios = []
    for prompt in prompts:
        with torch.no_grad(), press(model):
            model(torch.tensor([prompt]))
        ratios.append(press.compression_ratio)
    return sum(ratios) / len(ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ruler_rows.add_arguments(parser, "512", ["niah_single_2"], 30)
    parser.add_argument("--surrogate", action="append", required=True, metavar="NAME=FOLDER")
    parser.add_argument("--thresholds", type=float, nargs="+", default=[-2.6, -1.6, -1.0, 0.0, 0.5])
    parser.add_argument(
        "--kv-memory-mib", type=positive_int, default=1536, help="kv_cache_memory_bytes: every prompt fits at once"
    )
    parser.add_argument(
        "--layout", choices=["per_layer", "per_head"], default="per_layer", help="the plugin's KV cache layout"
    )
    parser.add_argument("--judge-chunks", action="store_true", help="the plugin judges each prefill chunk")
    parser.add_argument(
        "--max-num-batched-tokens", type=positive_int, default=None, help="vLLM's tokens per step, every engine"
    )
    parser.add_argument("--out", type=output_file, required=True)
    add_engine_folder_argument(parser)
    args = parser.parse_args()
    surrogates = dict(item.split("=", 1) for item in args.surrogate)
    for name, folder in surrogates.items():
        try:
            resolve_folder(folder)
        except FileNotFoundError as err:
            parser.error(f"--surrogate {name}: {err}")
    model, tokenizer, bench, rows = ruler_rows.model_and_rows(args)
    prompts = demo_prompts(model, tokenizer, rows)
    new_tokens = int(rows["max_new_tokens"].max())
    model_json = json.loads(Path(args.model_json).read_text())
    engine = {"dtype": "float32", "enforce_eager": True, "enable_prefix_caching": False, "max_num_seqs": 64}
    engine |= {"max_model_len": max(map(len, prompts)) + new_tokens, "block_size": 32}
    engine |= {"kv_cache_memory_bytes": args.kv_memory_mib * 2**20}  # vLLM's CPU default sizes it by the machine
    engine |= {"hf_overrides": {"kvzap_model_id": model_json["model_id"]}}  # the surrogates' base model
    if args.max_num_batched_tokens:  # a prefill chunk is at most this long
        engine |= {"max_num_batched_tokens": args.max_num_batched_tokens, "enable_chunked_prefill": True}
    records = []
    with engine_folder(args.engine_folder) as folder:
        dense_run = run_engine(folder, "dense", model_json["path"], prompts, engine, new_tokens)
        dense = scored(bench, rows, answers(model, tokenizer, dense_run["tokens"]))
        low, high = dense["average_ci"]
        records.append(
            {
                "surrogate": "dense vLLM",
                "threshold": None,
                "score": dense["average"],
                "score_ci": [low, high],
                **dict.fromkeys(("fill_ratio", "kvzap_ratio", "inside_dense_interval")),  # nothing is pruned
            }
        )
        print_table(records, COLUMNS)
        for name, surrogate in surrogates.items():
            for tau in args.thresholds:
                kvzap = {"surrogate": str(Path(surrogate).resolve()), "threshold": tau}
                kvzap |= {} if args.layout == "per_layer" else {"layout": args.layout}  # per-layer records still match
                kvzap |= {"judge_chunks": True} if args.judge_chunks else {}
                run = run_engine(
                    folder,
                    f"{name}{tau}"
                    + ("" if args.layout == "per_layer" else f"-{args.layout}")
                    + ("-chunks" if args.judge_chunks else ""),
                    model_json["path"],
                    prompts,
                    engine | {"additional_config": {"kvzap": kvzap}},
                    new_tokens,
                )
                result = scored(bench, rows, answers(model, tokenizer, run["tokens"]))
                fill = KVzapLayerFillPress(surrogate, threshold=tau, decoding=True)
                records.append(
                    {
                        "surrogate": name,
                        "threshold": tau,
                        "score": result["average"],
                        "score_ci": result["average_ci"],
                        "fill_ratio": mean_ratio(model, prompts, fill),
                        "kvzap_ratio": mean_ratio(model, prompts, KVzapPress(surrogate, threshold=tau)),
                        "inside_dense_interval": low <= result["average"] <= high,
                    }
                )
                print_table(records[-1:], COLUMNS)
    headline = {
        name: max(
            (r["threshold"] for r in records if r["surrogate"] == name and r["inside_dense_interval"]), default=None
        )
        for name in surrogates
    }
    print_table(records, COLUMNS)
    print(f"headline thresholds (highest inside the dense engine's interval): {headline}")
    atomic_write_json(
        args.out,
        {
            "args": {k: str(v) for k, v in vars(args).items()},
            "machine": {"cpu_flags": cpu_flags(), "processor": platform.processor()},
            "prompt_tokens": list(map(len, prompts)),
            "layout": args.layout,
            "judge_chunks": args.judge_chunks,
            "records": records,
            "headline_threshold": headline,
        },
    )


if __name__ == "__main__":
    main()
