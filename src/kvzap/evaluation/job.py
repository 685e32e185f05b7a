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
from functools import partial
from pathlib import Path

import pandas as pd
import torch
from torch.nn.utils.rnn import pad_sequence
from tqdm import tqdm
from transformers import StoppingCriteria, StoppingCriteriaList, pipeline

from kvzap import families
from kvzap.atomic import atomic_write_json
from kvzap.evaluation import attention_record, long_samples, methods, presses, refusals
from kvzap.evaluation.attention_served import attention_served
from kvzap.evaluation.grouping import samples_per_decode
from kvzap.evaluation.predictions import measured_means, seed_averages, write_predictions
from kvzap.evaluation.prefill_cache import memory_after_prefill, prefill_cache
from kvzap.evaluation.shared_prefill import run_greedy_shared
from kvzap.evaluation.spec import JobError, JobSpec
from kvzap.evaluation.suites import benchmark_module
from kvzap.prepare import models
from kvzap.provenance import stamp
from kvzap.pruning.windowed_press import WindowedPress
from kvzap.refusal import entry_point


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


@dataclass
class Loaded:
    """What a job sets up once and every subset reuses: its cells, their presses, the model and the benchmark."""

    cells: list[tuple[str, float | None]]
    built: list[list[tuple[int | None, object]]]  # per cell, its (surrogate seed, press) runs; one without seeds
    model: object
    tokenizer: object
    bench: object  # the benchmark's suite module (load, score, GENERATION)
    generation: dict | None  # the sampling benchmark's generation settings, with --rollouts applied


def evaluate(spec: JobSpec) -> list[dict]:
    """Every cell and subset of one job (one cell, or a prefill group sharing one prefill per sample), the model
    loaded once.

    Outputs hold no timings, so that reruns and cluster runs reproduce them byte for byte."""
    spec = spec.resolved()  # provenance records the dtype the job runs in
    cells = [(cell.method, cell.value) for cell in spec.cells]
    infos = [presses.get(method) for method, _ in cells]
    if len(cells) > 1 and not all(info.shares_prefill for info in infos):
        raise JobError(f"Only methods that prune after attention share a job; {[m for m, _ in cells]} includes others.")
    bench = benchmark_module(spec.benchmark)
    generation = getattr(bench, "GENERATION", None)
    if generation and spec.rollouts:
        generation = {**generation, "n_rollouts": spec.rollouts}
    surrogates = spec.surrogate_folders()
    for (method, _), info in zip(cells, infos):
        if info.surrogate and not (surrogates[info.surrogate] and all(p.is_dir() for p in surrogates[info.surrogate])):
            raise JobError(
                f"Method {method} needs the {info.surrogate} surrogate folder (surrogate_{info.surrogate}); "
                "train it first."
            )
    attn = infos[0].attn_implementation if len(cells) == 1 else None  # a group decodes under "kvzap" attention
    model, tokenizer = models.load(spec.model, dtype=spec.dtype, attn_implementation=attn)
    check_family(model, spec.model_name, [method for method, _ in cells])
    decoding = bool(generation and generation.get("decoding_compression"))
    built = [runs(method, value, info, surrogates, decoding) for (method, value), info in zip(cells, infos)]
    loaded = Loaded(cells, built, model, tokenizer, bench, generation)
    results = []
    for subset in spec.subsets:
        results += evaluate_subset(spec, loaded, subset, [Path(cell.outs[subset]) for cell in spec.cells])
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
            raise JobError(
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


def evaluate_subset(spec: JobSpec, loaded: Loaded, subset: str, outs: list[Path]) -> list[dict]:
    torch.manual_seed(spec.seed)
    options = {"tasks": list(spec.tasks)} if spec.tasks else {}
    rows = loaded.bench.load(
        spec.source, subset, loaded.tokenizer, spec.n_samples, spec.seed, revision=spec.revision, **options
    )
    read = rows.attrs.get("revision")
    rows = rows.iloc[spec.shard :: spec.n_shards].reset_index(drop=True)  # this job's share of a long cell
    if rows.empty:
        raise JobError(
            f"Shard {spec.shard} of {spec.n_shards} of {spec.benchmark}/{subset} holds no rows: "
            "use fewer shards than rows (evaluation.benchmarks.<name>.shards)."
        )
    if spec.max_new_tokens:
        rows["max_new_tokens"] = rows["max_new_tokens"].clip(upper=spec.max_new_tokens)
    rows = long_samples.apply(rows, loaded.tokenizer, max_positions(loaded.model), spec.long_samples)

    sampled = bool(loaded.generation and loaded.generation.get("do_sample"))
    flat = [press for cell in loaded.built for _, press in cell]
    model, tokenizer = loaded.model, loaded.tokenizer
    if shares_prefill(model, loaded) and not sampled:
        decode_batch = spec.decode_batch or len(flat)
        samples = samples_per_decode(spec.batch_size, decode_batch, len(flat))
        group, attention = recorded(
            model, partial(run_greedy_shared, model, tokenizer, rows, flat, decode_batch, samples)
        )
        answers = iter((output, attention) for output in group)  # what served the group served each of its cells
    elif sampled:
        settings = (loaded.generation, spec.seed, spec.batch_size)
        answers = (recorded(model, partial(run_sampling, model, tokenizer, rows, press, *settings)) for press in flat)
    else:
        answers = (recorded(model, partial(run_greedy, model, tokenizer, rows, press)) for press in flat)
    per_cell = [[(seed, *next(answers)) for seed, _ in cell] for cell in loaded.built]  # (seed, outputs, attention)
    outputs = [with_seeds([(seed, output) for seed, output, _ in cell]) for cell in per_cell]
    served = [attention_record.union([attention for *_, attention in cell]) for cell in per_cell]
    common = spec.params(sampled) | {"dataset_revision": read}
    return [
        write_cell(spec, loaded, rows, output, subset, cell, out, common, attention)
        for cell, output, out, attention in zip(loaded.cells, outputs, outs, served)
    ]


def recorded(model, run) -> tuple[object, dict]:
    """A run's outputs and the attention that served it (kvzap.evaluation.attention_record)."""
    with attention_served(model) as attention:
        outputs = run()
    return outputs, attention


def max_positions(model) -> int:
    """The positions the model was trained for (a multimodal config keeps them in its text part)."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return int(config.max_position_embeddings)


def write_cell(
    spec: JobSpec,
    loaded: Loaded,
    rows,
    outputs,
    subset: str,
    cell: tuple[str, float | None],
    out: Path,
    common: dict,
    attention: dict,
) -> dict:
    """One cell's predictions.csv and metrics.json; its provenance names its own method and value, as a job of
    this cell alone would, the dataset revision read, and the attention that served it."""
    method, value = cell
    predictions = rows.drop(columns=["context"]).merge(outputs, on="sample_id")
    score = lambda rows: loaded.bench.score(rows, frozenset(spec.departures))  # noqa: E731
    # a split cell is scored once, by its merge
    metrics = {**score(predictions), "seeds": seed_averages(score, predictions)} if spec.n_shards == 1 else {}
    params = common | {"method": method, "value": value, "subset": subset, "model": spec.model}
    metrics.update(
        {
            **measured_means(predictions),
            "n_samples": int(rows.shape[0]),
            "long_samples": long_samples.summary(predictions, spec.long_samples, max_positions(loaded.model)),
            "model": spec.model_name,
            "bench": spec.bench_name,
            "benchmark": spec.benchmark,
            "subset": subset,
            "method": method,
            "value": value,
            "shard": spec.shard,
            "n_shards": spec.n_shards,
            "provenance": stamp(params, models.read_record(spec.model), spec.seed),
            attention_record.FIELD: attention,
        }
    )
    metrics["json_columns"] = write_predictions(predictions, out / "predictions.csv")
    atomic_write_json(out / "metrics.json", metrics)
    return metrics


@entry_point
def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--spec", required=True, help="the job's spec (kvzap.evaluation.spec.JobSpec) as JSON, or a file holding it"
    )
    args = parser.parse_args(argv)
    for metrics in evaluate(JobSpec.read(args.spec)):
        print(
            json.dumps(
                {k: metrics.get(k) for k in ("benchmark", "subset", "method", "value", "average", "compression_ratio")}
            )
        )


if __name__ == "__main__":
    main()
