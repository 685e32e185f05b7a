"""What one row of a prefill group costs, stage by stage: the context's prefill, every cell's kept entries (its
press's hook on the recorded prefill), the batched cache and the decode of the question and answers of every cell,
as a job of the group runs them (kvzap.evaluation.shared_prefill). The default cells are config/paper_small.yaml's
RULER-4k group (13 cells), so the record says what that entry's 200 rows cost and which stage bounds it.

    python benchmarks/group_row.py --model results/paper-small/smollm2-135m/model.json \
        --surrogates results/paper-small/smollm2-135m/surrogates --out benchmarks/cpu/group_row_4k.json
"""

from __future__ import annotations

import argparse
import time

import torch

from kvzap.atomic import atomic_write_json
from kvzap.evaluation import presses
from kvzap.evaluation.shared_prefill import batched_cache, decode, kept_rows, pipeline_prompt, record
from kvzap.evaluation.suites import ruler
from kvzap.prepare.models import load
from kvzap.pruning.attention import use_kvzap_attention
from kvzap.surrogate.settings import KINDS
from records import add_group_arguments, cpu_flags, group_cells, output_file, positive_int, print_table

CELLS = [
    "full", *(f"{m}={t}" for m in ("kvzap_linear", "kvzap_mlp") for t in (-4.3, -3.4, -2.7, -1.8)),
    *(f"{m}={r}" for m in ("kvzap_mlp_head", "kvzap_mlp_layer") for r in (0.5, 0.75)),
]  # fmt: skip
STAGES = ["prefill_s", "kept_s", "cache_s", "decode_s"]


def timed(run):
    start = time.perf_counter()
    out = run()
    return out, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_group_arguments(parser, CELLS, context=4096, n_samples=1)
    parser.add_argument("--max-new-tokens", type=positive_int, default=20)
    parser.add_argument("--threads", type=positive_int, default=1, help="1: as each of a run's parallel jobs")
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args()
    cells = group_cells(parser, args.cells)
    torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model, dtype="float32")
    use_kvzap_attention(model)
    from transformers import pipeline

    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device=model.device)
    built = [presses.build(m, v, {kind: args.surrogates / kind for kind in KINDS}) for m, v in cells]
    rows = ruler.load("offline", str(args.context), tokenizer, args.n_samples, 42, tasks=args.tasks)
    heads = model.config.num_key_value_heads
    measured = []
    for row in rows.itertuples():
        context_ids, question = pipeline_prompt(pipe, row, model.device)
        prefill, prefill_s = timed(lambda: record(model, context_ids))
        kept, kept_s = timed(lambda: [kept_rows(model, prefill, press) for press in built])
        cache, cache_s = timed(lambda: batched_cache([(prefill, kept)], heads))
        new_tokens = [min(int(row.max_new_tokens), args.max_new_tokens)] * len(built)
        _, decode_s = timed(
            lambda: decode(model, cache, [question] * len(built), [prefill.length] * len(built), new_tokens)
        )
        measured.append({"prefill_s": prefill_s, "kept_s": kept_s, "cache_s": cache_s, "decode_s": decode_s})
    mean = {stage: round(sum(t[stage] for t in measured) / len(measured), 3) for stage in STAGES}
    record_out = {
        **mean, "row_s": round(sum(mean.values()), 3), "rows": len(measured), "cells": args.cells,
        "context_tokens": args.context, "tasks": args.tasks, "threads": args.threads,
        "max_new_tokens": args.max_new_tokens, "dtype": "float32", "cpu_flags": cpu_flags(), "per_row": measured,
    }  # fmt: skip
    atomic_write_json(args.out, record_out)
    print_table([record_out], [*STAGES, "row_s"])


if __name__ == "__main__":
    main()
