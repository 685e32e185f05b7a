"""The most a surrogate can reach: KVzap's rule (window, one global threshold) fed the oracle's own scores.

For each RULER-style sample, the KVzip+ oracle (kvzap.oracle.scores) scores the context's tokens; KVzapPress then
prunes that sample's prefill with those log KVzip+ scores in place of a surrogate's predictions
(PrecomputedScorerPress, placed at the context's tokens in the pipeline's prompt; the template and instruction
around it get no score and are kept), greedy as in the pipeline (kvzap.evaluation.job.run_greedy, kvpress's
protocol). A perfect surrogate would score like this; the demo's KVzap cells at the same compression show how far
the trained ones are from it. The oracle's log scores are not spread like a surrogate's predictions (a regression
pulls them towards the mean), so the same compression takes other thresholds.

    python benchmarks/oracle_ceiling.py --out results/benchmarks/oracle_ceiling.json \
        [--subset 512] [--tasks niah_single_2] [--n-samples 30] [--thresholds -1.0 -0.6 -0.3 0.0]
"""

from __future__ import annotations

import argparse

import pandas as pd
import torch
from tqdm import tqdm
from transformers import pipeline

import ruler_rows
from kvzap.atomic import atomic_write_json
from kvzap.evaluation.job import run_greedy
from kvzap.oracle.scores import build_repeat_prompt, oracle_scores
from kvzap.pruning import KVzapPress, PrecomputedScorerPress
from records import output_file, print_table


def context_offset(prompt_ids: torch.Tensor, context_ids: torch.Tensor) -> int:
    """Where the context's own tokens start in the pipeline's prompt (the oracle scored them tokenized alone)."""
    n = len(context_ids)
    for start in range(len(prompt_ids) - n + 1):
        if torch.equal(prompt_ids[start : start + n], context_ids):
            return start
    raise ValueError(
        "The context's tokens do not appear as one run in the pipeline's prompt (the chat template merged a token "
        "at its edge), so the oracle's scores cannot be placed: try another --subset or --seed."
    )


def sample_scores(model, tokenizer, pipe, row) -> tuple[torch.Tensor, int]:
    """The oracle's log KVzip+ scores of one sample's context, and where they start in its prefilled ids."""
    prompt = build_repeat_prompt(tokenizer, row.context)
    scores = oracle_scores(model, prompt).kvzip_plus_log
    options = pipe._sanitize_parameters(question=row.question, answer_prefix=row.answer_prefix)[0]
    prompt_ids = pipe.preprocess(row.context, **options)["context_ids"][0]
    return scores, context_offset(prompt_ids, prompt.input_ids[0, prompt.context])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=output_file, required=True)
    parser.add_argument("--thresholds", type=float, nargs="+", default=[-1.0, -0.6, -0.3, 0.0])
    ruler_rows.add_arguments(parser, subset="512", tasks=["niah_single_2"], n_samples=30)  # the demo's
    args = parser.parse_args()
    model, tokenizer, bench, rows = ruler_rows.model_and_rows(args)
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device=model.device)

    outputs = {tau: [] for tau in args.thresholds}
    for i in tqdm(range(len(rows)), desc="samples (oracle, then each threshold)"):
        row = rows.iloc[[i]]
        scores, offset = sample_scores(model, tokenizer, pipe, next(row.itertuples()))
        for tau in args.thresholds:
            press = KVzapPress(PrecomputedScorerPress(scores=scores, offset=offset), threshold=tau)
            outputs[tau].append(run_greedy(model, tokenizer, row, press))

    records = []
    for tau, parts in outputs.items():
        predictions = pd.concat(parts, ignore_index=True)
        scored = bench.score(rows.drop(columns=["context"]).merge(predictions, on="sample_id"))
        records.append(
            {
                "scores": "oracle log KVzip+",
                "threshold": tau,
                "compression_ratio": float(predictions["compression_ratio"].mean()),
                "average": scored["average"],
                "average_ci": scored["average_ci"],
                "n_samples": len(rows),
                "subset": args.subset,
                "tasks": args.tasks,
                "threads": args.threads,
            }
        )
    print_table(records, ["threshold", "compression_ratio", "average", "average_ci", "n_samples"])
    atomic_write_json(args.out, records)


if __name__ == "__main__":
    main()
