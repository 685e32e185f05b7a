"""Which training data the surrogates need: held-out R^2 and benchmark accuracy at matched compression, against
the number of training pairs and the text sources they come from, for KVzap-Linear and KVzap-MLP.

For every (sources, size): both surrogates are fitted on the first `size` pairs of those sources (the oracle's
training split interleaves its sources, so a prefix is as diverse as the whole), their R^2 measured on the
held-out prompts, then each is calibrated to `--target-ratio` on the benchmark's own contexts and evaluated on
them, so accuracies are compared at the same compression. One forward per context records its attention inputs:
a prefill's scores do not depend on tau or on the surrogate (see kvzap.pruning.calibration), so every surrogate is
calibrated from the same record. The full cache is scored once, as the reference. Each surrogate's R^2 is also
measured on the benchmark's own contexts (the oracle run on one context in four, every token): a fit that holds
on held-out training text may not carry over to the text being pruned. Every number has its 95 % interval.
Hybrid models: R^2 and calibration are over the pruned (full-attention) layers only, those the oracle scores.

    python -m kvzap.ablations.training_data --data results/<model>/oracle --model results/<model>/model.json \
        --sizes 7500 30000 100000 --sources all essays=essays --out results/<model>/ablations/training_pairs.json ...
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm
from transformers import DynamicCache

from kvzap import dtypes
from kvzap.atomic import atomic_write_json
from kvzap.evaluation.job import greedy_summary
from kvzap.evaluation.suites import benchmark_module
from kvzap.layer_types import pruned_layers
from kvzap.oracle.scores import build_repeat_prompt, oracle_scores
from kvzap.prepare import models
from kvzap.provenance import stamp
from kvzap.pruning import KVzapPress, SurrogateScorerPress
from kvzap.pruning.calibration import ScoreSample, mean_ratio, threshold_for
from kvzap.refusal import Refusal, entry_point
from kvzap.surrogate.settings import KINDS
from kvzap.training import fit
from kvzap.training.shards import ShardRows
from kvzap.window import WINDOW  # the protected recent tokens are never judged


def source_pairs(folder: Path, subsets: list[str] | None) -> np.ndarray:
    """Global indices of the oracle pairs whose prompt comes from `subsets` (None: any), in collection order."""
    manifest = fit.load_manifest(folder)
    prompt_of = ShardRows(fit.shards(folder)).gather("prompt", np.arange(manifest["n_pairs"])).numpy()
    allowed = [i for i, subset in enumerate(manifest["prompt_subsets"]) if subsets is None or subset in subsets]
    return np.flatnonzero(np.isin(prompt_of, allowed))


def selections(folder: Path, sources: dict[str, list[str] | None], sizes: list[int]) -> dict:
    """{(source name, size): the first `size` pairs of that source}. All sources together must hold every size; a
    narrower source skips the sizes it cannot fill (it is smaller, which is part of what is measured)."""
    chosen = {}
    for name, subsets in sources.items():
        pairs = source_pairs(folder, subsets)
        for size in sizes:
            if len(pairs) >= size:
                chosen[name, size] = pairs[:size]
            elif subsets is None:
                raise Refusal(
                    f"The oracle's training split holds {len(pairs)} pairs, not {size}: lower the size "
                    "or collect more prompts (oracle.n_train)."
                )
            else:
                print(f"{name}: {len(pairs)} pairs from {subsets}, fewer than {size}; that size is skipped for it")
    return chosen


@torch.no_grad()
def attention_inputs(model, contexts: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Per context (1, T) ids, the attention input h (T, D) of every pruned layer (a hybrid's sliding-window layers
    are never judged), in order, from one plain prefill."""
    records = []
    for ids in tqdm(contexts, desc="record attention inputs"):
        layers = []
        hooks = [
            model.model.layers[i].self_attn.register_forward_hook(
                lambda module, args, kwargs, output: layers.append(kwargs["hidden_states"][0].clone()), with_kwargs=True
            )
            for i in pruned_layers(model.config)
        ]
        try:
            model.model(input_ids=ids.to(model.device), past_key_values=DynamicCache())
        finally:
            for hook in hooks:
                hook.remove()
        records.append(layers)
    return records


@torch.no_grad()
def benchmark_pairs(model, tokenizer, contexts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(h (N, L, D), log KVzip+ (N, L, H), context index (N,)) for every token of the given benchmark contexts."""
    hidden, scores, index = [], [], []
    for i, context in enumerate(tqdm(contexts, desc="oracle on benchmark contexts")):
        prompt = build_repeat_prompt(tokenizer, context)
        oracle = oracle_scores(model, prompt, keep_positions=torch.arange(prompt.context.stop - prompt.context.start))
        hidden.append(oracle.hidden.transpose(0, 1).float())
        scores.append(oracle.kvzip_plus_log.permute(2, 0, 1).float())
        index.append(torch.full((len(scores[-1]),), i))
    return torch.cat(hidden), torch.cat(scores), torch.cat(index)


@torch.no_grad()
def score_samples(surrogate, records: list[list[torch.Tensor]]) -> list[ScoreSample]:
    """What a prefill under KVzapPress would judge: each pruned layer's scores of the tokens that leave the window
    (`records` from attention_inputs, for the layers the surrogate scores)."""
    samples = []
    for layers in records:
        scores = [
            surrogate.score_layer(i, h[None].float())[0, :, :-WINDOW].flatten()
            for i, h in zip(surrogate.scored, layers, strict=True)
        ]
        samples.append(ScoreSample(scores, layers[0].shape[0] * surrogate.output_dim))
    return samples


def fit_kind(kind: str, data: Path, pairs: np.ndarray, args, scratch: Path) -> tuple:
    """(surrogate, the epoch whose weights it keeps: None for the ridge)."""
    if kind == "linear":
        return fit.fit_ridge(data / "train", args.alpha, pairs=pairs), None
    model, history = fit.fit_mlp(
        data / "train",
        scratch,
        args.epochs,
        args.lr,
        args.batch_size,
        seed=args.seed,
        pairs=pairs,
        valid_split=args.valid_split,
        keep=args.keep,
    )
    return model, history[-1]["epoch"] if args.keep == "last" else min(history, key=lambda h: h["valid_loss"])["epoch"]


def parse_sources(specs: list[str]) -> dict[str, list[str] | None]:
    """ "all" -> every source; "name=a,b" -> the subsets a and b, reported as name."""
    return {spec.partition("=")[0]: (spec.partition("=")[2].split(",") if "=" in spec else None) for spec in specs}


def run(args) -> dict:
    chosen = selections(args.data / "train", parse_sources(args.sources), args.sizes)  # refused before any work
    model, tokenizer = models.load(args.model, dtype=args.dtype)
    bench = benchmark_module(args.benchmark)
    rows = bench.load(
        args.source, args.subset, tokenizer, args.n_samples, args.seed, **({"tasks": args.tasks} if args.tasks else {})
    )
    if args.max_new_tokens:
        rows["max_new_tokens"] = rows["max_new_tokens"].clip(upper=args.max_new_tokens)
    records = attention_inputs(model, [tokenizer(c, return_tensors="pt")["input_ids"] for c in rows["context"]])
    bench_h, bench_y, bench_context = benchmark_pairs(model, tokenizer, list(rows["context"][::4]))
    _, full = greedy_summary(model, tokenizer, rows, bench, None)
    results = []
    for (name, size), pairs in chosen.items():
        for kind in KINDS:
            torch.manual_seed(args.seed)
            with tempfile.TemporaryDirectory() as scratch:
                surrogate, best_epoch = fit_kind(kind, args.data, pairs, args, Path(scratch))
            y_true, y_pred, prompts = fit.predict(surrogate, args.data / "test")
            with torch.no_grad():
                bench_pred = surrogate(bench_h)
            samples = score_samples(surrogate, records)
            tau = threshold_for(samples, args.target_ratio)
            scorer = SurrogateScorerPress(surrogate=surrogate, check_base_model=False)
            _, result = greedy_summary(model, tokenizer, rows, bench, KVzapPress(scorer, threshold=tau))
            results.append(
                {
                    "sources": name,
                    "n_pairs": size,
                    "kind": kind,
                    "best_epoch": best_epoch,
                    "r2_mean": float(fit.squared_pearson(y_true, y_pred).mean()),
                    "r2_mean_ci": list(fit.r2_interval(y_true, y_pred, prompts)),
                    "r2_benchmark": float(fit.squared_pearson(bench_y, bench_pred).mean()),
                    "r2_benchmark_ci": list(fit.r2_interval(bench_y, bench_pred, bench_context)),
                    "threshold": tau,
                    "calibrated_ratio": mean_ratio(samples, tau),
                    **result,
                }
            )
            print(
                {
                    k: results[-1][k]
                    for k in (
                        "sources",
                        "n_pairs",
                        "kind",
                        "r2_mean",
                        "r2_benchmark",
                        "compression_ratio",
                        "average",
                        "average_ci",
                    )
                },
                flush=True,
            )
    manifest = fit.load_manifest(args.data / "train")
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "out"}
    return {
        **stamp(
            {**settings, "data": manifest["params_hash"]},
            {"model_id": manifest["model_id"], "revision": manifest["model_revision"]},
            args.seed,
        ),
        "target_ratio": args.target_ratio,
        "n_samples": len(rows),
        "full": full,
        "rows": results,
    }


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True, help="oracle folder with train/ and test/")
    parser.add_argument("--model", type=Path, required=True, help="model.json written by kvzap.prepare.models")
    parser.add_argument("--dtype", choices=dtypes.CHOICES, required=True, help="auto: the fastest exact one here")
    parser.add_argument("--sizes", type=int, nargs="+", required=True, help="training pairs per surrogate")
    parser.add_argument("--sources", nargs="+", required=True, help='"all", or name=subset[,subset...]')
    parser.add_argument("--alpha", type=float, required=True)
    parser.add_argument("--epochs", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--batch-size", type=int, required=True)
    parser.add_argument("--valid-split", choices=fit.VALID_SPLITS, required=True)
    parser.add_argument("--keep", choices=fit.KEEP, required=True)
    parser.add_argument("--benchmark", required=True, help="benchmark type, e.g. ruler")
    parser.add_argument("--source", required=True, help="benchmark data source (offline, hub, local:<folder>)")
    parser.add_argument("--subset", required=True, help="e.g. the RULER context length")
    parser.add_argument("--tasks", nargs="*", default=None)
    parser.add_argument("--n-samples", type=int, required=True, help="per task")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="cap (default: the benchmark's own)")
    parser.add_argument(
        "--target-ratio", type=float, required=True, help="compression every surrogate is calibrated to"
    )
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--out", type=Path, required=True, help="JSON file")
    return parser


@entry_point
def main() -> None:
    args = build_parser().parse_args()
    args.dtype = dtypes.resolve(args.dtype)  # provenance records the dtype the job runs in
    atomic_write_json(args.out, run(args))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
