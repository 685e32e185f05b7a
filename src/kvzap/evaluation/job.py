"""One evaluation cell: (benchmark, subset, model, method, parameter) -> predictions.csv + metrics.json.

Protocol of kvpress's pipeline: the chat-templated context is prefilled under the press (and compressed);
question and answer prefix follow uncompressed; greedy decoding with per-task lengths. Benchmarks whose
GENERATION asks for sampling (AIME25) instead run `model.generate` under the press with compression during
decoding, several rollouts per problem.
"""

from __future__ import annotations

import argparse
import json
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch
from torch.nn.utils.rnn import pad_sequence
from tqdm import tqdm
from transformers import StoppingCriteria, StoppingCriteriaList, pipeline

from kvzap import dtypes, families
from kvzap.atomic import atomic_write_json
from kvzap.evaluation import long_samples, methods, presses, refusals
from kvzap.evaluation.grouping import samples_per_decode
from kvzap.evaluation.metrics import DEPARTURES
from kvzap.evaluation.predictions import measured_means, seed_averages, write_predictions
from kvzap.evaluation.prefill_cache import memory_after_prefill, prefill_cache
from kvzap.evaluation.shared_prefill import run_greedy_shared
from kvzap.evaluation.suites import BENCHMARKS, benchmark_module
from kvzap.prepare import models
from kvzap.provenance import stamp
from kvzap.pruning.windowed_press import WindowedPress


def _compression_ratio(press) -> float:
    return 0.0 if press is None else float(press.compression_ratio)


def run_greedy(model, tokenizer, rows: pd.DataFrame, press) -> pd.DataFrame:
    """kvpress's pipeline, one sample at a time, each into a fresh `prefill_cache` (sliding layers bounded); per
    sample, the answer, the compression ratio and the KV bytes held after the prefill (and the full cache's)."""
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device=model.device)
    out = []
    for row in tqdm(list(rows.itertuples()), desc="samples"):
        with memory_after_prefill(model) as memory:
            answer = pipe(
                row.context,
                question=row.question,
                answer_prefix=row.answer_prefix,
                press=press,
                max_new_tokens=int(row.max_new_tokens),
                cache=prefill_cache(model, press),
            )["answer"]
        ratio = _compression_ratio(press)
        out.append({"sample_id": row.sample_id, "prediction": answer, "compression_ratio": ratio, **memory})
    return pd.DataFrame(out)


def greedy_summary(model, tokenizer, rows: pd.DataFrame, bench, press) -> tuple[pd.DataFrame, dict]:
    """Greedy answers of one press on benchmark rows, and their summary outside the pipeline's cells (ablations,
    benchmarks): average and per-task scores with 95 % intervals, and the mean measured compression ratio."""
    outputs = run_greedy(model, tokenizer, rows, press)
    scored = bench.score(rows.drop(columns=["context"]).merge(outputs, on="sample_id"))
    return outputs, {
        **{k: scored[k] for k in ("average", "average_ci", "per_task", "per_task_ci")},
        "compression_ratio": float(outputs["compression_ratio"].mean()),
    }


def batches_rows(press) -> bool:
    """Whether a cell may generate several rows at once: the full cache and our presses (each row of a padded
    batch is judged and counted as alone); kvpress's presses assume batch size 1."""
    return press is None or isinstance(press, WindowedPress)


def _prompt_ids(tokenizer, row, generation: dict) -> list[int]:
    """The chat-templated prompt; a base model (no template) reads the plain text after its BOS, as kvpress's
    pipeline gives it (the tokenizer adds what it adds to any text)."""
    text = (row.context + row.question).strip()
    if not tokenizer.chat_template:
        return tokenizer(text + "\n")["input_ids"]
    messages = [{"role": "user", "content": text}]
    return tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, enable_thinking=generation["enable_thinking"], return_dict=True
    )["input_ids"]


def _left_padded(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [torch.tensor(prompt) for prompt in prompts]
    ids = pad_sequence(rows, batch_first=True, padding_value=pad_id, padding_side="left")
    mask = pad_sequence([torch.ones_like(row) for row in rows], batch_first=True, padding_side="left")
    return ids.to(device), mask.to(device)


class RowRatios(StoppingCriteria):
    """Each row's compression ratio when it ends (its end-of-sequence token or its own token limit), as a batch-1
    run reports it: generate keeps feeding finished rows padding until the whole batch ends, and the cache counts
    those tokens. Stops nothing itself."""

    def __init__(self, press, eos, prompt_length: int, limits: list[int]):
        self.press, self.prompt_length, self.limits = press, prompt_length, [int(n) for n in limits]
        self.eos = torch.tensor(eos if isinstance(eos, list) else [] if eos is None else [eos])
        self.ratios: list[float | None] = [None] * len(limits)

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        new = input_ids.shape[1] - self.prompt_length
        ended = torch.isin(input_ids[:, -1].cpu(), self.eos).tolist()
        self._take([r is None and (ended[i] or new >= self.limits[i]) for i, r in enumerate(self.ratios)])
        return torch.zeros(input_ids.shape[0], dtype=torch.bool, device=input_ids.device)

    def final(self) -> list[float]:
        """Rows that never ended (the batch's own limit came first) get their ratio at the end."""
        self._take([r is None for r in self.ratios])
        return self.ratios

    def _take(self, rows: list[bool]) -> None:
        """Record the current ratio of the chosen rows (one read of the press's ratios, only if any)."""
        if any(rows):
            if isinstance(self.press, WindowedPress):
                now = self.press.sample_ratios.tolist()
            else:  # the full cache, or a kvpress press (batch 1, its set ratio)
                now = [_compression_ratio(self.press)] * len(rows)
            self.ratios = [now[i] if chosen else r for i, (chosen, r) in enumerate(zip(rows, self.ratios))]


def run_sampling(
    model, tokenizer, rows: pd.DataFrame, press, generation: dict, seed: int, batch_size: int = 1
) -> pd.DataFrame:
    """AIME protocol: the whole chat (problem and reasoning) is subject to eviction during decoding.

    The (problem, rollout) pairs are generated `batch_size` at a time, left-padded (1 for kvpress's presses); a
    batch is seeded by its first pair's index, so a cell reproduces for a given batch size."""
    sampling = {k: generation[k] for k in ("do_sample", "temperature", "top_p", "top_k")}
    batch_size = batch_size if batches_rows(press) else 1
    prompts = {row.sample_id: _prompt_ids(tokenizer, row, generation) for row in rows.itertuples()}
    pairs = [(row, r) for row in rows.itertuples() for r in range(generation["n_rollouts"])]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = []
    for first in tqdm(range(0, len(pairs), batch_size), desc=f"rollouts ({batch_size} per batch)"):
        batch = pairs[first : first + batch_size]
        ids, mask = _left_padded([prompts[row.sample_id] for row, _ in batch], pad_id, model.device)
        torch.manual_seed(seed * 1000 + first)
        options = dict(
            attention_mask=mask,
            max_new_tokens=max(int(row.max_new_tokens) for row, _ in batch),
            pad_token_id=pad_id,
            **sampling,
        )
        ratios = RowRatios(
            press, model.generation_config.eos_token_id, ids.shape[1], [r.max_new_tokens for r, _ in batch]
        )
        with press(model) if press is not None else nullcontext():
            generated = model.generate(ids, stopping_criteria=StoppingCriteriaList([ratios]), **options)
        for i, ((row, rollout), ratio) in enumerate(zip(batch, ratios.final())):
            answer = generated[i, ids.shape[1] : ids.shape[1] + int(row.max_new_tokens)]
            out.append(
                {
                    "sample_id": row.sample_id,
                    "rollout": rollout,
                    "prediction": tokenizer.decode(answer, skip_special_tokens=True),
                    "compression_ratio": float(ratio),
                    "prompt_tokens": len(prompts[row.sample_id]),
                }
            )
    return pd.DataFrame(out)


def parse_cell(token: str) -> tuple[str, float | None]:
    """METHOD or METHOD=VALUE (kvzap.plan.commands.cell_token) -> (method, value); a bad token stops with its fix."""
    method, _, value = token.partition("=")
    if method not in methods.METHODS:
        raise SystemExit(f"--cells {token!r}: unknown method {method!r}. Fix: use one of {sorted(methods.METHODS)}.")
    try:
        return method, float(value) if value else None
    except ValueError:
        raise SystemExit(
            f"--cells {token!r}: {value!r} is not a number. Fix: write METHOD=VALUE, e.g. knorm=0.5."
        ) from None


@dataclass
class Loaded:
    """What a job sets up once and every subset reuses: its cells, their presses, the model and the benchmark."""

    cells: list[tuple[str, float | None]]
    built: list[list[tuple[int | None, object]]]  # per cell, its (surrogate seed, press) runs; one without seeds
    model: object
    tokenizer: object
    bench: object  # the benchmark's suite module (load, score, GENERATION)
    generation: dict | None  # the sampling benchmark's generation settings, with --rollouts applied


def evaluate(args) -> list[dict]:
    """Every cell and subset of one job (one cell, or a prefill group sharing one prefill per sample), the model
    loaded once.

    Outputs hold no timings, so that reruns and cluster runs reproduce them byte for byte."""
    cells = [parse_cell(token) for token in args.cells]
    if args.decode_batch is not None and args.decode_batch < 1:
        raise SystemExit(f"--decode-batch {args.decode_batch}: must be at least 1 (cells decoded as one batch).")
    if args.batch_size < 1:
        raise SystemExit(f"--batch-size {args.batch_size}: must be at least 1 (rows generated as one batch).")
    if len(cells) * len(args.subsets) != len(args.out):
        raise SystemExit(
            f"--out needs one folder per cell and subset, cell by cell: {len(cells)} x {len(args.subsets)}, "
            f"got {len(args.out)}."
        )
    infos = [presses.get(method) for method, _ in cells]
    if len(cells) > 1 and not all(info.shares_prefill for info in infos):
        raise SystemExit(f"Only methods that prune after attention share a job; {args.cells} includes others.")
    bench = benchmark_module(args.benchmark)
    generation = getattr(bench, "GENERATION", None)
    if generation and args.rollouts:
        generation = {**generation, "n_rollouts": args.rollouts}
    surrogates = {"linear": args.surrogate_linear or [], "mlp": args.surrogate_mlp or []}
    for (method, _), info in zip(cells, infos):
        if info.surrogate and not (surrogates[info.surrogate] and all(p.is_dir() for p in surrogates[info.surrogate])):
            raise SystemExit(
                f"Method {method} needs the {info.surrogate} surrogate folder (--surrogate-{info.surrogate}); "
                "train it first."
            )
    attn = infos[0].attn_implementation if len(cells) == 1 else None  # a group decodes under "kvzap" attention
    model, tokenizer = models.load(args.model, dtype=args.dtype, attn_implementation=attn)
    check_family(model, args.model_name, [method for method, _ in cells])
    decoding = bool(generation and generation.get("decoding_compression"))
    built = [runs(method, value, info, surrogates, decoding) for (method, value), info in zip(cells, infos)]
    loaded = Loaded(cells, built, model, tokenizer, bench, generation)
    folders = iter(args.out)
    outs = [[next(folders) for _ in args.subsets] for _ in cells]  # cell by cell
    results = []
    for i, subset in enumerate(args.subsets):
        results += evaluate_subset(args, loaded, subset, [o[i] for o in outs])
    return results


def runs(
    method: str, value, info, surrogates: dict[str, list[Path]], decoding: bool
) -> list[tuple[int | None, object]]:
    """One cell's (seed, press) runs: one per trained seed of its surrogate (each folder's metrics.json names its
    seed), or a single unseeded one for a method without a surrogate."""
    if not info.surrogate:
        return [(None, presses.build(method, value, {}, decoding=decoding))]
    folders = surrogates[info.surrogate]
    built = [presses.build(method, value, {info.surrogate: folder}, decoding=decoding) for folder in folders]
    if len(folders) == 1:
        return [(None, built[0])]
    return [(json.loads((folder / "metrics.json").read_text())["seed"], press) for folder, press in zip(folders, built)]


def with_seeds(outputs: list[tuple[int | None, pd.DataFrame]]) -> pd.DataFrame:
    """A cell's outputs over its runs: the one run's, or every seed's rows with a `seed` column."""
    if len(outputs) == 1:
        return outputs[0][1]
    return pd.concat([output.assign(seed=seed) for seed, output in outputs], ignore_index=True)


def check_family(model, name: str, cell_methods: list[str]) -> None:
    """The planner's family checks on the loaded model's config (the plan skips them when it cannot read one)."""
    config = model.config.to_dict()
    for method in cell_methods:
        reason = refusals.refusal(config, method)
        if reason:
            raise SystemExit(
                f"{methods.label(method)} cannot run on model {name} ({model.config.model_type}): {reason}. "
                f"Fix: add {method} to models.{name}.skip_methods."
            )


def shares_prefill(model, loaded: Loaded) -> bool:
    """Whether a job's runs (its cells, each with its surrogate seeds) go as one prefill group: several runs of
    methods that prune after attention, on a model whose own attention the batched decode (kvzap.pruning.attention)
    computes; otherwise one at a time through kvpress's pipeline."""
    several = sum(len(cell) for cell in loaded.built) > 1
    after_attention = all(presses.get(method).shares_prefill for method, _ in loaded.cells)
    return several and after_attention and families.pruned_attention_reason(model.config.to_dict()) is None


def evaluate_subset(args, loaded: Loaded, subset: str, outs: list[Path]) -> list[dict]:
    torch.manual_seed(args.seed)
    options = {"tasks": args.tasks} if args.tasks else {}
    rows = loaded.bench.load(
        args.source, subset, loaded.tokenizer, args.n_samples, args.seed, revision=args.revision, **options
    )
    read = rows.attrs.get("revision")
    rows = rows.iloc[args.shard :: args.n_shards].reset_index(drop=True)  # this job's share of a long cell
    if rows.empty:
        raise SystemExit(
            f"Shard {args.shard} of {args.n_shards} of {args.benchmark}/{subset} holds no rows: "
            "use fewer shards than rows (evaluation.benchmarks.<name>.shards)."
        )
    if args.max_new_tokens:
        rows["max_new_tokens"] = rows["max_new_tokens"].clip(upper=args.max_new_tokens)
    rows = long_samples.apply(rows, loaded.tokenizer, max_positions(loaded.model), args.long_samples)

    sampled = bool(loaded.generation and loaded.generation.get("do_sample"))
    flat = [press for cell in loaded.built for _, press in cell]
    if shares_prefill(loaded.model, loaded) and not sampled:
        decode_batch = args.decode_batch or len(flat)
        samples = samples_per_decode(args.batch_size, decode_batch, len(flat))
        answers = iter(run_greedy_shared(loaded.model, loaded.tokenizer, rows, flat, decode_batch, samples))
    elif sampled:
        model, tokenizer, generation = loaded.model, loaded.tokenizer, loaded.generation
        answers = iter(
            run_sampling(model, tokenizer, rows, press, generation, args.seed, args.batch_size) for press in flat
        )
    else:
        answers = iter(run_greedy(loaded.model, loaded.tokenizer, rows, press) for press in flat)
    outputs = [with_seeds([(seed, next(answers)) for seed, _ in cell]) for cell in loaded.built]
    # how rows were batched changes no greedy output (a sampled batch is seeded by its first row: that stays)
    layout = ("subsets", "out", "cells", "decode_batch") + (() if sampled else ("batch_size",))
    common = {k: v for k, v in vars(args).items() if k not in layout}
    common["dataset_revision"] = read
    return [
        write_cell(args, loaded, rows, output, subset, cell, out, common)
        for cell, output, out in zip(loaded.cells, outputs, outs)
    ]


def max_positions(model) -> int:
    """The positions the model was trained for (a multimodal config keeps them in its text part)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.max_position_embeddings)


def write_cell(
    args, loaded: Loaded, rows, outputs, subset: str, cell: tuple[str, float | None], out: Path, common: dict
) -> dict:
    """One cell's predictions.csv and metrics.json; its provenance names its own method and value, as a job of
    this cell alone would, and the dataset revision read."""
    method, value = cell
    predictions = rows.drop(columns=["context"]).merge(outputs, on="sample_id")
    score = lambda rows: loaded.bench.score(rows, frozenset(args.departures))  # noqa: E731
    # a split cell is scored once, by its merge
    metrics = {**score(predictions), "seeds": seed_averages(score, predictions)} if args.n_shards == 1 else {}
    params = common | {"method": method, "value": value, "subset": subset, "model": str(args.model)}
    metrics.update(
        {
            **measured_means(predictions),
            "n_samples": int(rows.shape[0]),
            "long_samples": long_samples.summary(predictions, args.long_samples, max_positions(loaded.model)),
            "model": args.model_name,
            "bench": args.bench_name,
            "benchmark": args.benchmark,
            "subset": subset,
            "method": method,
            "value": value,
            "shard": args.shard,
            "n_shards": args.n_shards,
            "provenance": stamp(params, models.read_record(args.model), args.seed),
        }
    )
    metrics["json_columns"] = write_predictions(predictions, out / "predictions.csv")
    atomic_write_json(out / "metrics.json", metrics)
    return metrics


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, required=True, help="model.json written by kvzap.prepare.models")
    parser.add_argument("--benchmark", required=True, choices=list(BENCHMARKS))
    parser.add_argument("--source", default="offline", help="hub, offline or local:<folder>")
    parser.add_argument("--subsets", nargs="+", required=True, help="RULER context lengths, LongBench tasks, aime25")
    parser.add_argument("--tasks", nargs="*", default=None, help="RULER tasks (default: all available)")
    parser.add_argument("--revision", default=None, help="the Hub dataset's revision (default: its main branch)")
    parser.add_argument(
        "--long-samples",
        choices=list(long_samples.POLICIES),
        default="run",
        help="samples past the model's positions: run (kvpress, the paper) or truncate_middle (THUDM, a deviation)",
    )
    parser.add_argument(
        "--departures",
        nargs="*",
        choices=list(DEPARTURES),
        default=[],
        help="deliberate departures from kvpress's scoring (kvzap.evaluation.metrics.DEPARTURES)",
    )
    parser.add_argument(
        "--cells", nargs="+", required=True, help="METHOD or METHOD=VALUE (threshold or ratio), one per cell"
    )
    parser.add_argument(
        "--decode-batch", type=int, default=None, help="cells of a prefill group decoded as one batch (default: all)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=1,
        help="rows generated as one batch: a sampling benchmark's rollouts, or a prefill group's samples x the cells "
        "decoded together (default: 1)",
    )
    parser.add_argument(
        "--surrogate-linear", type=Path, nargs="+", default=None, help="a surrogate folder per training seed"
    )
    parser.add_argument("--surrogate-mlp", type=Path, nargs="+", default=None, help="a surrogate folder per seed")
    parser.add_argument("--n-samples", type=int, default=None, help="per task (default: all)")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="cap on the benchmark's lengths")
    parser.add_argument("--rollouts", type=int, default=None, help="sampling benchmarks: rollouts per problem")
    parser.add_argument("--dtype", choices=dtypes.CHOICES, default="auto", help="auto: the fastest exact one here")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--shard", type=int, default=0, help="this job evaluates rows shard, shard + n, ...")
    parser.add_argument("--n-shards", type=int, default=1)
    parser.add_argument(
        "--out",
        type=Path,
        nargs="+",
        required=True,
        help="one cell (or shard) folder per cell and subset, cell by cell",
    )
    parser.add_argument("--model-name", required=True, help="the model's name in the config (recorded in metrics.json)")
    parser.add_argument("--bench-name", required=True, help="the benchmark entry's name in the config (recorded)")
    args = parser.parse_args(argv)
    args.dtype = dtypes.resolve(args.dtype)  # provenance records the dtype the job runs in
    return args


def main(argv=None) -> None:
    for metrics in evaluate(parse_args(argv)):
        print(
            json.dumps(
                {k: metrics.get(k) for k in ("benchmark", "subset", "method", "value", "average", "compression_ratio")}
            )
        )


if __name__ == "__main__":
    main()
