"""What a config will cost before it runs: per stage and model, the jobs, the prefill and generated tokens
(maximum and expected) and the GPU-hours, for the per-cell layout (one job, prefill and batch-1 decode per cell)
and the shared layout the pipeline runs (kvzap.plan.sweep.eval_jobs: one prefill and one batched decode per prefill
group). `python -m kvzap.plan --forecast CONFIG [--throughput FILE]`.

Token counts come from the config (RULER: the subset is the context length; AIME25: 30 problems) or, where the data
decides, from the typical lengths below. GPU time is tokens over a throughput table whose defaults are the H200
records in benchmarks/h200/ (Qwen3-8B geometry, bf16); a JSON file with the same keys, overall or per model name
({"qwen3-32b": {...}}), replaces them. An estimate, to compare layouts and size an allocation, not a measurement.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from kvzap.evaluation import methods
from kvzap.evaluation.grouping import samples_per_decode
from kvzap.evaluation.suites import catalog
from kvzap.plan.sweep import eval_jobs
from kvzap.refusal import Refusal

THROUGHPUT = {
    # benchmarks/h200/gpu_decode_8k_bfloat16.json: the full cache prefills 8,192 tokens in 0.325 s
    "prefill_tokens_per_s": 25_200,
    # the same record: one decoding step (batch 1, full cache) takes 70 ms; 32k and 128k take 65-68 ms, so a step
    # is launch-bound, and a batch of decode_batch rows is taken to cost one step too (not measured yet)
    "decode_step_s": 0.070,
    # loading the model and the data before the first sample: not measured on a GPU, set it from your cluster
    "job_start_s": 60.0,
}
# Typical lengths where the data, not the config, decides them (override with --throughput keys of these names):
TYPICAL = {
    "longbench_context_tokens": 9_000,  # LongBench's average: 6,711 words (English), 13,386 characters (Chinese)
    "longbench_samples_per_subset": 226,  # 4,750 samples over 21 subsets (most hold 200)
    "ruler_samples_per_task": 500,
    "aime_problems": 30,
    "aime_prompt_tokens": 200,
    "expected_new_fraction": {"ruler": 0.25, "longbench": 0.5, "aime25": 0.5},  # answers stop early (an estimate)
}
ORACLE_REPEAT = 2  # the oracle's prompt holds the context twice (user: ctx, assistant: ctx)


@dataclass
class Cost:
    jobs: int = 0
    prefill_tokens: float = 0
    new_tokens_max: float = 0
    new_tokens_expected: float = 0
    decode_steps_max: float = 0
    decode_steps_expected: float = 0

    def add(self, other: Cost) -> None:
        for key in vars(self):
            setattr(self, key, getattr(self, key) + getattr(other, key))

    def gpu_hours(self, speed: dict, expected: bool = True) -> float:
        steps = self.decode_steps_expected if expected else self.decode_steps_max
        seconds = self.jobs * speed["job_start_s"] + self.prefill_tokens / speed["prefill_tokens_per_s"]
        return (seconds + steps * speed["decode_step_s"]) / 3600


def _samples(bench: dict, subset: str, typical: dict) -> tuple[int, int, int]:
    """(samples, context tokens, max new tokens) of one subset of a benchmark entry."""
    kind, n = bench["benchmark"], bench.get("n_samples")
    if kind == "ruler":
        tasks = bench.get("tasks") or (
            catalog.RULER_OFFLINE_TASKS if bench["source"] == "offline" else catalog.RULER_TASKS
        )
        per_task = min(n or typical["ruler_samples_per_task"], typical["ruler_samples_per_task"])
        return per_task * len(tasks), int(subset), bench.get("max_new_tokens") or 128
    if kind == "longbench":
        count = min(n or typical["longbench_samples_per_subset"], typical["longbench_samples_per_subset"])
        return count, typical["longbench_context_tokens"], bench.get("max_new_tokens") or 128
    problems = min(n or typical["aime_problems"], typical["aime_problems"])
    return problems * (bench.get("rollouts") or 4), typical["aime_prompt_tokens"], bench.get("max_new_tokens") or 32_000


def _evaluation(config: dict, typical: dict, shared: bool) -> dict[str, Cost]:
    costs: dict[str, Cost] = {}
    for job in eval_jobs(config):
        bench = config["evaluation"]["benchmarks"][job.bench]
        cost = costs.setdefault(job.model, Cost())
        cells = job.cells
        grouped = shared and job.group is not None
        batches = math.ceil(len(cells) / config["evaluation"]["decode_batch"]) if grouped else len(cells)
        cost.jobs += bench["shards"] * (1 if grouped else len(cells))
        fraction = typical["expected_new_fraction"][bench["benchmark"]]
        # evaluation.batch_size rows per call in the layout the pipeline runs: AIME rollouts per generate call, a
        # prefill group's samples per decode (a batch steps until its longest row ends; the expected fraction is
        # kept as for one row, an estimate)
        rows = config["evaluation"]["batch_size"].get(job.model, 1) if shared else 1
        decode_batch = config["evaluation"]["decode_batch"]
        aime = bench["benchmark"] == "aime25"
        per_call = samples_per_decode(rows, decode_batch, len(cells)) if grouped else rows if aime else 1
        for subset in bench["subsets"]:
            samples, context, new = _samples(bench, subset, typical)
            passes = 1 if grouped else sum(2 if methods.METHODS[m].own_prefill else 1 for m, _ in cells)
            calls = math.ceil(samples / per_call)
            cost.prefill_tokens += samples * context * passes
            cost.new_tokens_max += samples * new * len(cells)
            cost.new_tokens_expected += samples * new * fraction * len(cells)
            cost.decode_steps_max += calls * new * batches
            cost.decode_steps_expected += calls * new * fraction * batches
    return costs


def _oracle(config: dict) -> dict[str, Cost]:
    oracle = config["oracle"]
    prompts = oracle["n_train"] + oracle["n_test"]
    tokens = prompts * (oracle["min_tokens"] + oracle["max_tokens"]) / 2 * ORACLE_REPEAT
    return {model: Cost(jobs=1, prefill_tokens=tokens) for model in config["models"]}


def forecast(config: dict, throughput: dict | None = None) -> list[dict]:
    """One row per (stage, model, layout), and a total per layout."""
    throughput = throughput or {}
    typical = {**TYPICAL, **{k: v for k, v in throughput.items() if k in TYPICAL}}

    def speed(model: str) -> dict:
        return {**THROUGHPUT, **{k: v for k, v in throughput.items() if k in THROUGHPUT}, **throughput.get(model, {})}

    rows = []
    for layout, shared in (("per-cell", False), ("shared", True)):
        stages = {"oracle": _oracle(config), "evaluate": _evaluation(config, typical, shared)}
        total = Cost()
        hours = [0.0, 0.0]
        for stage, per_model in stages.items():
            for model, cost in per_model.items():
                expected, maximum = cost.gpu_hours(speed(model)), cost.gpu_hours(speed(model), expected=False)
                rows.append(_row(layout, stage, model, cost, expected, maximum))
                total.add(cost)
                hours = [hours[0] + expected, hours[1] + maximum]
        rows.append(_row(layout, "all", "all", total, *hours))
    return rows


def _row(layout, stage, model, cost: Cost, expected: float, maximum: float) -> dict:
    return {
        "layout": layout,
        "stage": stage,
        "model": model,
        "jobs": cost.jobs,
        "prefill Mtok": round(cost.prefill_tokens / 1e6, 2),
        "new Mtok (max)": round(cost.new_tokens_max / 1e6, 2),
        "new Mtok (expected)": round(cost.new_tokens_expected / 1e6, 2),
        "GPU-h (expected)": round(expected, 1),
        "GPU-h (max)": round(maximum, 1),
    }


def read_throughput(path: Path | None) -> dict:
    if path is None:
        return {}
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise Refusal(f"--throughput {path}: not a readable JSON file ({err}). Fix: pass a JSON object.") from None
    if not isinstance(table, dict):
        raise Refusal(f"--throughput {path}: a JSON object is needed, e.g. {json.dumps(THROUGHPUT)}")
    unknown = set(table) - set(THROUGHPUT) - set(TYPICAL) - {k for k, v in table.items() if isinstance(v, dict)}
    if unknown:
        raise Refusal(f"--throughput {path}: unknown keys {sorted(unknown)}; use {sorted(THROUGHPUT | TYPICAL)}")
    return table
