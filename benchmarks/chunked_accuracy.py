"""Chunked prefill vs whole-prompt prefill: accuracy (95 % intervals) and compression on the demo's benchmark.

The same trained surrogate and threshold prune the same RULER-style samples, once with the paper's prefill (one
forward, then pruning) and once per `--chunks` size (each chunk attends to the cache already pruned), greedy as
in the pipeline (kvzap.evaluation.job.greedy_summary, kvpress's protocol). Chunks must be shorter than the contexts for
chunking to happen: the demo's 1k-token contexts take 256/512-token chunks.

    python benchmarks/chunked_accuracy.py --surrogate results/smollm2-135m/surrogates/mlp --threshold -2.6 \
        --out results/benchmarks/chunked_accuracy.json [--chunks 256 512] [--n-samples 20]
"""

from __future__ import annotations

import argparse

import ruler_rows
from kvzap.atomic import atomic_write_json
from kvzap.evaluation.job import greedy_summary
from kvzap.pruning import KVzapPress, SurrogateScorerPress
from records import output_file, positive_int


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=output_file, required=True)
    parser.add_argument(
        "--surrogate", required=True, help="surrogate folder (the demo's: results/<model>/surrogates/mlp)"
    )
    parser.add_argument("--threshold", type=float, required=True)
    parser.add_argument("--chunks", type=positive_int, nargs="+", default=[256, 512])
    ruler_rows.add_arguments(
        parser, subset="1024", tasks=["niah_single_1", "niah_single_2", "niah_multikey_1"], n_samples=20
    )
    args = parser.parse_args()
    model, tokenizer, bench, rows = ruler_rows.model_and_rows(args)
    scorer = SurrogateScorerPress(surrogate_path=args.surrogate, check_base_model=False)
    runs = {"whole": None, **{f"chunk {n}": n for n in args.chunks}}
    records = []
    for name, chunk in runs.items():
        outputs, result = greedy_summary(
            model, tokenizer, rows, bench, KVzapPress(scorer, threshold=args.threshold, prefill_chunk=chunk)
        )
        records.append(
            {
                "prefill": name,
                "chunk_tokens": chunk,
                "threshold": args.threshold,
                "n_samples": len(rows),
                **result,
                "predictions": outputs["prediction"].tolist(),
            }
        )
        print(
            f"[{name}] average {result['average']:.1f} {result['average_ci']}, "
            f"compression {result['compression_ratio']:.3f}",
            flush=True,
        )
    whole = records[0]["predictions"]
    for r in records:
        r["same_answers_as_whole"] = sum(a == b for a, b in zip(r["predictions"], whole)) / len(whole)
    atomic_write_json(args.out, records)
    print("prefill | chunk_tokens | compression_ratio | average | 95% interval | same answers as whole")
    for r in records:
        print(
            f"{r['prefill']} | {r['chunk_tokens']} | {r['compression_ratio']:.3f} | {r['average']:.1f} | "
            f"{r['average_ci'][0]:.1f}-{r['average_ci'][1]:.1f} | {r['same_answers_as_whole']:.2f}"
        )


if __name__ == "__main__":
    main()
