"""One evaluation cell: (benchmark, subset, model, method, parameter) -> predictions.csv + metrics.json.

Protocol of kvpress's pipeline: the chat-templated context is prefilled under the press (and compressed);
question and answer prefix follow uncompressed; greedy decoding with per-task lengths. Benchmarks whose
GENERATION asks for sampling (AIME25) instead run `model.generate` under the press with compression during
decoding, several rollouts per problem.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd
import torch
from tqdm import tqdm
from transformers import pipeline

from kvzap import methods, models
from kvzap.benchmarks import BENCHMARKS, benchmark_module
from kvzap.io import atomic_write_json
from kvzap.predictions import write_predictions
from kvzap.provenance import stamp


def _n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def check_lengths(rows: pd.DataFrame, tokenizer, max_positions: int) -> None:
    """Refuse, before any compute, samples that do not fit the model's context window (rows need context_tokens)."""
    for row in rows.itertuples():
        need = row.context_tokens + _n_tokens(tokenizer, row.question + row.answer_prefix) + 64 + row.max_new_tokens
        if need > max_positions:
            raise SystemExit(
                f"Sample {row.sample_id} needs ~{need} positions (context + question + template + {row.max_new_tokens} "
                f"new tokens) but the model allows {max_positions}: evaluate a shorter dataset configuration "
                "(e.g. a smaller RULER context length) or a model with a longer context."
            )


def _compression_ratio(press) -> float:
    return 0.0 if press is None else float(press.compression_ratio)


def run_greedy(model, tokenizer, rows: pd.DataFrame, press) -> pd.DataFrame:
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device=model.device)
    out = []
    for row in tqdm(list(rows.itertuples()), desc="samples"):
        answer = pipe(row.context, question=row.question, answer_prefix=row.answer_prefix, press=press,
                      max_new_tokens=int(row.max_new_tokens))["answer"]
        out.append({"sample_id": row.sample_id, "prediction": answer, "compression_ratio": _compression_ratio(press)})
    return pd.DataFrame(out)


def run_sampling(model, tokenizer, rows: pd.DataFrame, press, generation: dict, seed: int) -> pd.DataFrame:
    """AIME protocol: the whole chat (problem and reasoning) is subject to eviction during decoding."""
    sampling = {k: generation[k] for k in ("do_sample", "temperature", "top_p", "top_k")}
    out = []
    for row in tqdm(list(rows.itertuples()), desc="problems"):
        messages = [{"role": "user", "content": (row.context + row.question).strip()}]
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt",
                                            enable_thinking=generation["enable_thinking"], return_dict=True)["input_ids"]
        for rollout in range(generation["n_rollouts"]):
            torch.manual_seed(seed * 1000 + rollout)
            if press is None:
                generated = model.generate(ids.to(model.device), max_new_tokens=int(row.max_new_tokens), **sampling)
            else:
                with press(model):
                    generated = model.generate(ids.to(model.device), max_new_tokens=int(row.max_new_tokens), **sampling)
            text = tokenizer.decode(generated[0, ids.shape[1]:], skip_special_tokens=True)
            out.append({"sample_id": row.sample_id, "rollout": rollout, "prediction": text,
                        "compression_ratio": _compression_ratio(press), "prompt_tokens": ids.shape[1]})
    return pd.DataFrame(out)


def evaluate(args) -> dict:
    """Outputs hold no timings, so that reruns and cluster runs reproduce them byte for byte."""
    method = methods.get(args.method)
    bench = benchmark_module(args.benchmark)
    generation = getattr(bench, "GENERATION", None)
    if generation and args.rollouts:
        generation = {**generation, "n_rollouts": args.rollouts}
    surrogates = {"linear": args.surrogate_linear, "mlp": args.surrogate_mlp}
    if method.surrogate and not (surrogates[method.surrogate] and Path(surrogates[method.surrogate]).is_dir()):
        raise SystemExit(f"Method {args.method} needs the {method.surrogate} surrogate folder "
                         f"(--surrogate-{method.surrogate}); train it first.")
    model, tokenizer = models.load(args.model, dtype=args.dtype, attn_implementation=method.attn_implementation)
    torch.manual_seed(args.seed)
    options = {"tasks": args.tasks} if args.tasks else {}
    rows = bench.load(args.source, args.subset, tokenizer, args.n_samples, args.seed, **options)
    rows = rows.iloc[args.shard::args.n_shards].reset_index(drop=True)  # this job's share of a long cell
    if args.max_new_tokens:
        rows["max_new_tokens"] = rows["max_new_tokens"].clip(upper=args.max_new_tokens)
    rows["context_tokens"] = [_n_tokens(tokenizer, context) for context in rows["context"]]
    check_lengths(rows, tokenizer, model.config.max_position_embeddings)
    decoding = bool(generation and generation.get("decoding_compression"))
    press = methods.build(args.method, args.value, surrogates, decoding=decoding)

    if generation and generation.get("do_sample"):
        outputs = run_sampling(model, tokenizer, rows, press, generation, args.seed)
    else:
        outputs = run_greedy(model, tokenizer, rows, press)
    predictions = rows.drop(columns=["context"]).merge(outputs, on="sample_id")
    metrics = bench.score(predictions)
    metrics.update({
        "compression_ratio": float(predictions["compression_ratio"].mean()),
        "n_samples": int(rows.shape[0]),
        "benchmark": args.benchmark, "subset": args.subset, "method": args.method, "value": args.value,
        "shard": args.shard, "n_shards": args.n_shards,
        "provenance": stamp(vars(args) | {"model": str(args.model)}, models.read_record(args.model), args.seed),
    })
    metrics["json_columns"] = write_predictions(predictions, args.out / "predictions.csv")
    atomic_write_json(args.out / "metrics.json", metrics)
    return metrics


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="model.json written by kvzap.models")
    parser.add_argument("--benchmark", required=True, choices=list(BENCHMARKS))
    parser.add_argument("--source", default="offline", help="hub, offline or local:<folder>")
    parser.add_argument("--subset", required=True, help="RULER context length, LongBench task, aime25")
    parser.add_argument("--tasks", nargs="*", default=None, help="RULER tasks (default: all available)")
    parser.add_argument("--method", required=True)
    parser.add_argument("--value", type=float, default=None, help="threshold or compression ratio")
    parser.add_argument("--surrogate-linear", type=Path, default=None)
    parser.add_argument("--surrogate-mlp", type=Path, default=None)
    parser.add_argument("--n-samples", type=int, default=None, help="per task (default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="cap on the benchmark's lengths")
    parser.add_argument("--rollouts", type=int, default=None, help="sampling benchmarks: rollouts per problem")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--shard", type=int, default=0, help="this job evaluates rows shard, shard + n, ...")
    parser.add_argument("--n-shards", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True, help="cell (or shard) folder")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    metrics = evaluate(parse_args(argv))
    print(json.dumps({k: metrics[k] for k in ("benchmark", "method", "value", "average", "compression_ratio")}))


if __name__ == "__main__":
    main()
