"""AIME25 rollouts batched (`evaluation.batch_size`) vs one at a time, in the same run: wall time per cell and how
many greedy answers and per-row ratios agree (kvzap.evaluation.job.run_sampling, the pipeline's own function).

Per method (the full cache, KVzap with decoding-time pruning), the same problems and rollouts are generated at batch
1 and at `--batch-size`, greedy (to compare answers) and with AIME's sampling (to time the protocol itself; sampled
answers are seeded per batch, so they are not compared). KVzap's threshold comes from a seeded random linear
surrogate calibrated on a separate random prompt to `--ratio`: this measures speed and agreement, not accuracy.

    python benchmarks/aime_batching.py --model results/smollm2-135m/model.json \
        --problems local:tests/fixtures/aime25 --n-problems 2 --max-new-tokens 32 --threads 1 \
        --out benchmarks/cpu/aime_batching.json   # about 5 min on one core
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from kvzap.atomic import atomic_write_json
from kvzap.evaluation.job import run_sampling
from kvzap.evaluation.suites import aime
from kvzap.prepare.models import load
from kvzap.pruning import KVzapPress, SurrogateScorerPress
from kvzap.pruning.calibration import collect_scores, threshold_for
from kvzap.surrogate.model import Surrogate
from records import output_file, positive_int, print_table, unit_fraction

COLUMNS = ["method", "sampling", "rollouts", "batch_1_s", "batched_s", "speedup", "identical_answers", "max_ratio_gap"]


def kvzap_press(model, ratio: float, window: int):
    """A seeded random linear surrogate, its threshold calibrated to `ratio` on a random prompt."""
    torch.manual_seed(0)
    surrogate = Surrogate(model.config.hidden_size, model.config.num_key_value_heads, model.config.num_hidden_layers)
    scorer = SurrogateScorerPress(surrogate=surrogate)
    prompt = torch.randint(100, model.config.vocab_size, (1, 600), generator=torch.Generator().manual_seed(1))
    tau = threshold_for(collect_scores(model, [prompt], scorer, window), ratio)
    return lambda: KVzapPress(scorer, threshold=tau, window=window, decoding=True)


def timed(model, tokenizer, rows, make_press, generation, batch_size):
    start = time.perf_counter()
    outputs = run_sampling(model, tokenizer, rows, make_press(), generation, seed=0, batch_size=batch_size)
    return outputs, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="model.json of a prepared model")
    parser.add_argument("--problems", default="local:tests/fixtures/aime25", help="AIME25 source: hub, offline, local:")
    parser.add_argument("--n-problems", type=positive_int, default=3)
    parser.add_argument("--rollouts", type=positive_int, default=4, help="per problem")
    parser.add_argument("--batch-size", type=positive_int, default=4)
    parser.add_argument("--max-new-tokens", type=positive_int, default=64)
    parser.add_argument("--ratio", type=unit_fraction, default=0.5, help="KVzap's calibrated compression target")
    parser.add_argument("--window", type=positive_int, default=32, help="KVzap's window (short prompts here)")
    parser.add_argument("--threads", type=positive_int, default=2)
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    model, tokenizer = load(args.model, attn_implementation="sdpa")
    rows = aime.load(args.problems, aime.TASK, None, args.n_problems, seed=0)
    rows["max_new_tokens"] = args.max_new_tokens
    sampled = {**aime.GENERATION, "n_rollouts": args.rollouts, "enable_thinking": False}
    greedy = {**sampled, "do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    methods = {"full": lambda: None, "kvzap": kvzap_press(model, args.ratio, args.window)}
    records = []
    for name, make_press in methods.items():
        for label, generation in (("greedy", greedy), ("sampled", sampled)):
            one, one_s = timed(model, tokenizer, rows, make_press, generation, 1)
            many, many_s = timed(model, tokenizer, rows, make_press, generation, args.batch_size)
            greedy_run = label == "greedy"
            same = int((one["prediction"] == many["prediction"]).sum()) if greedy_run else None
            gap = float((one["compression_ratio"] - many["compression_ratio"]).abs().max()) if greedy_run else None
            records.append(
                {
                    "method": name,
                    "sampling": label,
                    "rollouts": len(one),
                    "batch_size": args.batch_size,
                    "batch_1_s": round(one_s, 2),
                    "batched_s": round(many_s, 2),
                    "speedup": round(one_s / many_s, 2),
                    "identical_answers": same,
                    "max_ratio_gap": gap,
                    "compression_ratio": round(float(many["compression_ratio"].mean()), 4),
                    "max_new_tokens": args.max_new_tokens,
                    "model": str(args.model),
                    "device": str(model.device),
                }
            )
            print(records[-1], flush=True)
    print_table(records, COLUMNS)
    atomic_write_json(args.out, {"records": records})


if __name__ == "__main__":
    main()
