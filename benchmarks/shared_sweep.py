"""Evaluation of one sweep several ways, in the same run: the per-cell path (a job per cell: load the model, prefill
every sample, decode alone), the shared layout the pipeline runs (a job per prefill group: one prefill per sample,
one batched decode; kvzap.evaluation.shared_prefill) and, with `--batch-size N`, the shared layout decoding several
samples together (N rows: samples x cells, as evaluation.batch_size). Prints wall times and how many greedy answers
agree with the per-cell path's (or, with --skip-per-cell, with the shared layout's one sample at a time).

    python benchmarks/shared_sweep.py --model results/smollm2-135m/model.json \
        --surrogates results/smollm2-135m/surrogates --out benchmarks/cpu/shared_sweep_demo.json
    python benchmarks/shared_sweep.py --model results/smollm2-135m/model.json --skip-per-cell --batch-size 40 \
        --surrogates results/smollm2-135m/surrogates --out benchmarks/cpu/shared_sweep_batched.json
"""

from __future__ import annotations

import argparse
import time

import torch

from kvzap.atomic import atomic_write_json
from kvzap.evaluation import job, methods, presses
from kvzap.evaluation.grouping import samples_per_decode
from kvzap.evaluation.shared_prefill import run_greedy_shared
from kvzap.evaluation.suites import ruler
from kvzap.prepare.models import load
from kvzap.surrogate.settings import KINDS
from records import add_group_arguments, group_cells, output_file, positive_int, print_table

CELLS = [
    "full", "kvzap_linear=-3", "kvzap_linear=-2.6", "kvzap_mlp=-3", "kvzap_mlp=-2.6",
    "knorm=0.5", "knorm=0.75", "streaming_llm=0.5", "streaming_llm=0.75", "snapkv=0.5",
]  # fmt: skip
COLUMNS = ["cells", "samples", "per_cell_s", "shared_s", "speedup", "identical_answers"]
BATCHED_COLUMNS = ["samples_per_decode", "batched_s", "batched_vs_shared", "batched_identical_answers", "answers"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_group_arguments(parser, CELLS, context=1024, n_samples=4)
    parser.add_argument("--max-new-tokens", type=positive_int, default=12)
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--decode-batch", type=positive_int, default=16, help="cells decoded as one batch")
    parser.add_argument("--batch-size", type=positive_int, default=1, help="rows per decode (samples x cells)")
    parser.add_argument("--skip-per-cell", action="store_true", help="time the shared layout only")
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    cells = group_cells(parser, args.cells)
    surrogates = {kind: args.surrogates / kind for kind in KINDS}
    _, tokenizer = load(args.model, dtype="float32")
    rows = ruler.load("offline", str(args.context), tokenizer, args.n_samples, 42, tasks=args.tasks)
    rows["max_new_tokens"] = rows["max_new_tokens"].clip(upper=args.max_new_tokens)

    per_cell_s, alone = None, None
    if not args.skip_per_cell:
        start = time.perf_counter()
        alone = []
        for method, value in cells:  # what a job per cell pays: the model loaded, every sample prefilled, decoded alone
            model, tokenizer = load(
                args.model, dtype="float32", attn_implementation=methods.METHODS[method].attn_implementation
            )
            alone.append(job.run_greedy(model, tokenizer, rows, presses.build(method, value, surrogates)))
        per_cell_s = time.perf_counter() - start

    def shared(samples: int) -> tuple[float, list]:
        """One job for the prefill group, as kvzap.plan.sweep.eval_jobs lays it out."""
        start = time.perf_counter()
        model, tokenizer = load(args.model, dtype="float32")
        built = [presses.build(method, value, surrogates) for method, value in cells]
        frames = run_greedy_shared(model, tokenizer, rows, built, args.decode_batch, samples)
        return time.perf_counter() - start, frames

    shared_s, together = shared(1)
    samples = samples_per_decode(args.batch_size, args.decode_batch, len(cells))
    batched_s, batched = shared(samples) if samples > 1 else (None, None)
    reference = alone or together

    def agreeing(frames) -> int | None:
        if frames is None:
            return None
        return sum(a == b for x, y in zip(reference, frames) for a, b in zip(x["prediction"], y["prediction"]))

    record = {
        "cells": len(cells), "jobs_per_cell": len(cells), "jobs_shared": 1, "per_cell_s": per_cell_s,
        "shared_s": shared_s, "speedup": per_cell_s / shared_s if per_cell_s else None,
        "batched_s": batched_s, "samples_per_decode": samples,
        "batched_vs_shared": shared_s / batched_s if batched_s else None,
        "identical_answers": None if alone is None else agreeing(together),
        "batched_identical_answers": agreeing(batched),
        "answers_compared_with": "shared, one sample per decode" if alone is None else "per-cell",
        "answers": len(cells) * len(rows), "samples": len(rows), "context_tokens": args.context, "tasks": args.tasks,
        "cell_list": args.cells, "threads": args.threads, "decode_batch": args.decode_batch,
        "batch_size": args.batch_size,
        "compression_ratios": {c: float(t["compression_ratio"].mean()) for c, t in zip(args.cells, together)},
    }  # fmt: skip
    atomic_write_json(args.out, record)
    print_table([record], COLUMNS + (BATCHED_COLUMNS if batched else []))


if __name__ == "__main__":
    main()
