"""What a config will cost before it runs, priced as SLURM bills it: per stage (oracle, training, evaluation) and
model, the jobs, the prefill and generated tokens (maximum and expected), the jobs' hours and the GPU-hours (each
job's GPUs, from the model's `resources`, times its wall time), for the per-cell layout (one job, prefill and batch-1
decode per cell) and the shared layout the pipeline runs (kvzap.plan.sweep.eval_jobs: one prefill and one batched
decode per prefill group). `python -m kvzap.plan --forecast CONFIG [--throughput FILE | --calibrate]`.

Token counts come from the config (RULER: the subset is the context length; AIME25: 30 problems) or, where the data
decides, from the typical lengths below. Seconds come from a throughput table. Its defaults are the H200 records in
benchmarks/h200/ for Qwen3-8B's geometry (`REFERENCE`); every other model is scaled from them by its size
(kvzap.plan.geometry): compute by FLOPs per token, a decoding step's fixed cost by layers, a row's KV read by its KV
bytes, the start-up by parameters. A job's GPUs run its layers in turn (device_map="auto"), so a 2-GPU job is no
faster than one GPU and is billed twice. A JSON file replaces keys: overall ones describe the reference model on your
GPUs (and are scaled like the defaults), a model's own ({"qwen3-32b": {...}}) are that model's, as measured. On this
machine, `--calibrate` measures the config's models (kvzap.plan.calibrate) and the forecast then also gives each
stage's wall time on its cores (kvzap.plan.schedule). An estimate, to size an allocation, not a measurement.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from kvzap.evaluation import methods
from kvzap.evaluation.grouping import samples_per_decode
from kvzap.evaluation.suites import catalog
from kvzap.plan.cluster import resource
from kvzap.plan.geometry import REFERENCE, Geometry
from kvzap.plan.recipe import recipe
from kvzap.plan.sweep import Cell, EvalJob, cells, eval_jobs
from kvzap.refusal import Refusal
from kvzap.training.corpus import subsets

THROUGHPUT = {
    # benchmarks/h200/gpu_decode_8k_bfloat16.json: the full cache prefills 8,192 tokens in 0.325 s
    "prefill_tokens_per_s": 25_200,
    # the same record: one decoding step (batch 1, full cache) takes 70 ms; 32k and 128k take 65-68 ms
    # (gpu_decode.json), so a step is launch-bound: a fixed cost per step (scaled by layers) ...
    "decode_step_s": 0.070,
    # ... plus, per row of a batched step, its token's compute (None: one prefill token's time) ...
    "decode_row_s": None,
    # ... and the read of its cached keys and values (an H200's HBM3e; None: inside the measured step times)
    "kv_read_bytes_per_s": 4.8e12,
    # a step over a pruned cache against the dense step: 1.25-1.29 at 32k tokens (gpu_decode.json), 1.12-1.33 over the
    # H200 records; applied to the steps of cells that decode over a pruned cache
    "pruned_step_factor": 1.25,
    # the oracle's repeat prompt (the context twice) per second, KVzip+ scoring included (None: prefill speed over
    # ORACLE_COST, a ratio measured by the CPU calibration: no GPU run of the oracle is recorded)
    "oracle_tokens_per_s": None,
    # KVzip's and KVzip+'s repetition of the context on its cache (kvpress's KVzipPress), context tokens per second
    # (None: the oracle's speed, which scores the same repetition)
    "repeat_tokens_per_s": None,
    # surrogate training reads each pair's attention inputs (all layers, bf16) every epoch from memory-mapped shards,
    # which outgrow memory at the paper's size: an assumption (a node's NVMe), not measured on a GPU
    "train_read_bytes_per_s": 2e9,
    # (pair, layer) visits per second of a surrogate's fit (None: the read above bounds them)
    "mlp_pair_layers_per_s": None,
    "linear_pair_layers_per_s": None,
    # loading the model and the data before the first sample (scaled by parameters): an assumption, set it from your
    # cluster
    "job_start_s": 60.0,
    # a job that loads no model (tables, figures): the interpreter and its imports
    "light_job_s": 5.0,
}
# benchmarks/cpu/oracle_demo.json: the oracle takes 1.32-1.41 times a plain forward of the same repeat prompt (512
# and 1,024-token contexts): its scoring, beyond the forward no oracle can skip
ORACLE_COST = 1.4
# Typical lengths where the data, not the config, decides them (override with --throughput keys of these names):
TYPICAL = {
    "longbench_context_tokens": 9_000,  # LongBench's average: 6,711 words (English), 13,386 characters (Chinese)
    "longbench_samples_per_subset": 226,  # 4,750 samples over 21 subsets (most hold 200)
    "ruler_samples_per_task": 500,
    "aime_problems": 30,
    "aime_prompt_tokens": 200,
    "expected_new_fraction": {"longbench": 0.5, "aime25": 0.5},  # answers stop early (an estimate)
    "ruler_answer_tokens": 32,  # a RULER answer (needles, words) with its chat ending, at most max_new_tokens
    "oracle_prompt_tokens": None,  # a prompt's mean length (None: midway between oracle.min_tokens and max_tokens)
    "oracle_train_prompts": None,  # the prompts the corpus gives (None: oracle.n_train and n_test per subset)
    "oracle_test_prompts": None,
    "question_tokens": 40,  # a question, its answer prefix and chat template, fed after the context (the demo's: ~40)
}
ORACLE_REPEAT = 2  # the oracle's prompt holds the context twice (user: ctx, assistant: ctx)
REPEAT_PASS = ("kvzip", "kvzip_plus")  # kvpress's KVzipPress repeats the context on its cache to score it


@dataclass
class Job:
    """One job as the cluster runs it: its stage, model, GPUs and threads, what it computes and how long it takes."""

    stage: str
    model: str
    gpus: int
    threads: int | str  # a count, or "all" (the machine's cores)
    seconds: float  # expected
    seconds_max: float
    prefill_tokens: float = 0
    new_tokens_max: float = 0
    new_tokens_expected: float = 0
    needs: tuple[str, ...] = ()  # the stages of the same model that must finish first
    priority: int = 0  # Snakemake's rule priority (the oracle's: 10)
    name: str = ""


@dataclass
class Speed:
    """One model's throughput: the table's keys for it, scaled from the reference unless they are its own."""

    values: dict
    geometry: Geometry
    dtype: str

    def __getitem__(self, key: str) -> float:
        return self.values[key]

    def step_s(self, rows: int, context: float, pruned: bool) -> float:
        """One decoding step of `rows` rows over `context` cached tokens each."""
        bandwidth = self["kv_read_bytes_per_s"]
        kv = 0.0 if bandwidth is None else rows * context * self.geometry.kv_bytes_per_token(self.dtype) / bandwidth
        step = self["decode_step_s"] + (rows - 1) * self["decode_row_s"] + kv
        return step * (self["pruned_step_factor"] if pruned else 1.0)


def model_speed(config: dict, model: str, throughput: dict) -> Speed:
    """The throughput table for one model: the reference's (defaults, then the table's overall keys) scaled by the
    model's size, then the model's own keys as they are."""
    entry = config["models"][model]
    geometry = Geometry.of(entry["id"], entry.get("revision"))
    base = {**THROUGHPUT, **{k: v for k, v in throughput.items() if k in THROUGHPUT}}
    compute, layers, parameters = relative_size(geometry)
    values = {
        **base,
        "prefill_tokens_per_s": base["prefill_tokens_per_s"] / compute,
        "decode_step_s": base["decode_step_s"] * layers,
        "job_start_s": base["job_start_s"] * parameters,
    }
    if values["oracle_tokens_per_s"] is None:
        values["oracle_tokens_per_s"] = values["prefill_tokens_per_s"] / ORACLE_COST
    else:
        values["oracle_tokens_per_s"] /= compute
    if values["repeat_tokens_per_s"] is not None:
        values["repeat_tokens_per_s"] /= compute
    values.update(throughput.get(model, {}))
    values["repeat_tokens_per_s"] = values["repeat_tokens_per_s"] or values["oracle_tokens_per_s"]
    if values["decode_row_s"] is None:
        values["decode_row_s"] = 1 / values["prefill_tokens_per_s"]
    read_bound = values["train_read_bytes_per_s"] / (geometry.shape.D_h * 2)  # a bf16 h row per (pair, layer)
    for key in ("mlp_pair_layers_per_s", "linear_pair_layers_per_s"):
        values[key] = values[key] or read_bound
    return Speed(values, geometry, entry.get("dtype", "bfloat16"))


def relative_size(geometry: Geometry) -> tuple[float, float, float]:
    """A model's FLOPs per token, layers and parameters over the reference model's: what its speed is scaled by."""
    reference = Geometry.of(REFERENCE)
    return (
        geometry.flops_per_token / reference.flops_per_token,
        geometry.layers / reference.layers,
        geometry.parameters / reference.parameters,
    )


def _gpus(config: dict, model: str, stage: str) -> int:
    return int(resource(config, model, stage, "gpu"))


def _threads(config: dict, model: str, stage: str):
    return resource(config, model, stage, "cpus")


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


def _expected_new(bench: dict, new: int, typical: dict) -> float:
    """The tokens an answer is expected to take: RULER's are short (a needle, a few words) whatever the cap, others a
    share of max_new_tokens."""
    if bench["benchmark"] == "ruler":
        return min(new, typical["ruler_answer_tokens"])
    return new * typical["expected_new_fraction"][bench["benchmark"]]


def _runs(config: dict, method: str) -> int:
    """Presses a cell runs: one per trained seed of its surrogate (KVzap-MLP with training.seeds), else one."""
    seeds = config["training"].get("seeds") or [None]
    return len(seeds) if methods.METHODS[method].surrogate == "mlp" else 1


def _prunes(method: str) -> bool:
    """Decodes over a cache of kvzap's own pruned layers (segment attention), not a dense or masked one."""
    return methods.METHODS[method].kvzap_attention


def _evaluation_jobs(config: dict, job: EvalJob, speed: Speed, typical: dict, shared: bool) -> list[Job]:
    """The cluster jobs of one planned evaluation job (its shards), or of each of its cells (the per-cell layout)."""
    if shared and job.group is not None:
        return _priced(config, job, speed, typical, grouped=True)
    alone = [replace(job, group=None, cells=(cell,)) for cell in job.cells]
    return [one for cell in alone for one in _priced(config, cell, speed, typical, grouped=False)]


def decode_shape(config: dict, job: EvalJob, grouped: bool) -> tuple[int, int, int]:
    """How a job decodes: (samples per call, decodes per call, rows per decode). A prefill group decodes its cells'
    runs decode_batch at a time, with evaluation.batch_size rows' worth of samples; a cell alone decodes each run in
    turn, one sample a call, or batch_size rollouts of a sampled benchmark (AIME)."""
    evaluation = config["evaluation"]
    runs = sum(_runs(config, method) for method, _ in job.cells)
    rows = evaluation["batch_size"].get(job.model, 1)
    if grouped:
        decode_batch = evaluation["decode_batch"]
        per_call = samples_per_decode(rows, decode_batch, runs)
        return per_call, math.ceil(runs / decode_batch), per_call * min(decode_batch, runs)
    per_call = rows if evaluation["benchmarks"][job.bench]["benchmark"] in catalog.SAMPLED_BENCHMARKS else 1
    return per_call, runs, per_call


def _priced(config: dict, job: EvalJob, speed: Speed, typical: dict, grouped: bool) -> list[Job]:
    bench = config["evaluation"]["benchmarks"][job.bench]
    runs = sum(_runs(config, method) for method, _ in job.cells)
    pruned = any(_prunes(method) for method, _ in job.cells)
    per_call, batches, decode_rows = decode_shape(config, job, grouped)
    repeat = job.cells[0][0] in REPEAT_PASS and not grouped
    shards = bench["shards"]
    seconds, seconds_max, prefill, new_max, new_expected = 0.0, 0.0, 0.0, 0.0, 0.0
    for subset in bench["subsets"]:
        samples, context, new = _samples(bench, subset, typical)
        samples = math.ceil(samples / shards)  # one shard's rows
        expected = _expected_new(bench, new, typical)
        # each cell's run of a sample is a decode row: it is fed the question after the (shared or own) context
        tokens = samples * (context * (1 if grouped else runs) + runs * typical["question_tokens"])
        prefill_s = tokens / speed["prefill_tokens_per_s"]
        if repeat:  # KVzip's repetition of the context on its cache, to score it
            prefill_s += samples * context / speed["repeat_tokens_per_s"]
            tokens += samples * context
        calls = math.ceil(samples / per_call)
        step = speed.step_s(decode_rows, context + expected / 2, pruned)
        step_max = speed.step_s(decode_rows, context + new / 2, pruned)
        seconds += prefill_s + calls * batches * expected * step
        seconds_max += prefill_s + calls * batches * new * step_max
        prefill += tokens
        new_max += samples * new * runs
        new_expected += samples * expected * runs
    start = speed["job_start_s"]
    return [
        Job(
            "evaluate",
            job.model,
            _gpus(config, job.model, "evaluate"),
            _threads(config, job.model, "evaluate"),
            start + seconds,
            start + seconds_max,
            prefill,
            new_max,
            new_expected,
            needs=("train",) if any(methods.METHODS[m].surrogate for m, _ in job.cells) else ("prepare",),
            name=f"evaluate {job.bench} {job.group or job.cells[0][0]} shard {shard}",
        )
        for shard in range(shards)
    ]


def oracle_prompts(config: dict, typical: dict) -> tuple[int, int]:
    """(training prompts, all prompts) the oracle scores: as counted in the corpus where a calibration did, else
    n_train and n_test per subset of the corpus (a subset with fewer passages of the right length gives fewer)."""
    oracle = config["oracle"]
    count = len(subsets(oracle["corpus"]))
    train = typical["oracle_train_prompts"] or oracle["n_train"] * count
    return train, train + (typical["oracle_test_prompts"] or oracle["n_test"] * count)


def prompt_tokens(config: dict, typical: dict) -> float:
    oracle = config["oracle"]
    return typical["oracle_prompt_tokens"] or (oracle["min_tokens"] + oracle["max_tokens"]) / 2


def _oracle_job(config: dict, model: str, speed: Speed, typical: dict) -> Job:
    _, prompts = oracle_prompts(config, typical)
    tokens = prompts * prompt_tokens(config, typical) * ORACLE_REPEAT
    seconds = speed["job_start_s"] + tokens / speed["oracle_tokens_per_s"]
    return Job(
        "oracle",
        model,
        _gpus(config, model, "oracle"),
        _threads(config, model, "oracle"),
        seconds,
        seconds,
        tokens,
        needs=("prepare",),
        priority=10,
        name="oracle",
    )


def _train_jobs(config: dict, model: str, speed: Speed, typical: dict) -> list[Job]:
    """One job per surrogate kind and seed: the ridge passes over the pairs once, the MLP once per epoch."""
    train_prompts, _ = oracle_prompts(config, typical)
    per_prompt = config["oracle"]["tokens_per_prompt"]
    pairs = train_prompts * (prompt_tokens(config, typical) if per_prompt == "all" else per_prompt)
    visits = pairs * speed.geometry.layers
    jobs = []
    for kind in config["training"]["surrogates"]:
        seeds = (config["training"].get("seeds") or [None]) if kind == "mlp" else [None]
        epochs = config["training"]["epochs"] if kind == "mlp" else 1
        seconds = speed["job_start_s"] + visits * epochs / speed[f"{kind}_pair_layers_per_s"]
        gpus, threads = _gpus(config, model, "train"), _threads(config, model, "train")
        jobs += [
            Job("train", model, gpus, threads, seconds, seconds, needs=("oracle",), name=f"train {kind} {seed}")
            for seed in seeds
        ]
    return jobs


def jobs(config: dict, throughput: dict | None = None, shared: bool = True) -> list[Job]:
    """Every job of the run a config asks for (the shared or the per-cell evaluation layout)."""
    throughput = throughput or {}
    typical = {**TYPICAL, **{k: v for k, v in throughput.items() if k in TYPICAL}}
    out = []
    for model in config["models"]:
        speed = model_speed(config, model, throughput)
        prepare_s = speed.values.get("prepare_s", speed["light_job_s"])
        out.append(Job("prepare", model, _gpus(config, model, "prepare"), 1, prepare_s, prepare_s, name="prepare"))
        # the model's own recipe (kvzap.plan.recipe), and what the corpus gives it where a calibration counted
        own = {**typical, **{k: v for k, v in throughput.get(model, {}).items() if k in TYPICAL}}
        out.append(_oracle_job(recipe(config, model), model, speed, own))
        out += _train_jobs(recipe(config, model), model, speed, own)
        for job in eval_jobs(config):
            if job.model == model:
                out += _evaluation_jobs(config, job, speed, typical, shared)
        light = speed["light_job_s"]
        out += [
            Job("merge", model, 0, 1, light, light, needs=("evaluate",), name="merge") for _ in _merged(config, model)
        ]
    reports = 1 + len(config.get("figures") or {})  # the tables, then each figure
    light = {**THROUGHPUT, **throughput}["light_job_s"]
    out += [
        Job("report", "all", 0, 1, light, light, needs=("evaluate", "merge"), name="report") for _ in range(reports)
    ]
    return out


def _merged(config: dict, model: str) -> list[Cell]:
    """The cells a merge job joins: those of entries split into shards."""
    benches = config["evaluation"]["benchmarks"]
    return [cell for cell in cells(config) if cell.model == model and benches[cell.bench]["shards"] > 1]


def forecast(config: dict, throughput: dict | None = None) -> list[dict]:
    """One row per (layout, stage, model) and a total per layout; prepare (no GPU) is left out of the rows."""
    rows = []
    for layout, shared in (("per-cell", False), ("shared", True)):
        planned = [job for job in jobs(config, throughput, shared) if job.stage in ("oracle", "train", "evaluate")]
        for stage in ("oracle", "train", "evaluate"):
            for model in config["models"]:
                rows.append(_row(layout, stage, model, [j for j in planned if (j.stage, j.model) == (stage, model)]))
        rows.append(_row(layout, "all", "all", planned))
    return rows


def _row(layout: str, stage: str, model: str, planned: list[Job]) -> dict:
    return {
        "layout": layout,
        "stage": stage,
        "model": model,
        "jobs": len(planned),
        "prefill Mtok": round(sum(j.prefill_tokens for j in planned) / 1e6, 2),
        "new Mtok (max)": round(sum(j.new_tokens_max for j in planned) / 1e6, 2),
        "new Mtok (expected)": round(sum(j.new_tokens_expected for j in planned) / 1e6, 2),
        "job-h (expected)": round(sum(j.seconds for j in planned) / 3600, 1),
        "GPU-h (expected)": round(sum(j.gpus * j.seconds for j in planned) / 3600, 1),
        "GPU-h (max)": round(sum(j.gpus * j.seconds_max for j in planned) / 3600, 1),
    }


def scaling(config: dict, throughput: dict | None = None) -> list[dict]:
    """What each model's speed was scaled by from the reference's, and whether its geometry was known."""
    out = []
    for model in config["models"]:
        entry = config["models"][model]
        geometry = Geometry.of(entry["id"], entry.get("revision"))
        compute, layers, _ = relative_size(geometry)
        out.append(
            {
                "model": model,
                "FLOPs/token vs reference": round(compute, 2),
                "layers vs reference": round(layers, 2),
                "own throughput keys": len((throughput or {}).get(model, {})),
                "geometry": "known" if geometry.known else "unknown: priced as the reference",
            }
        )
    return out


def read_throughput(path: Path | None) -> dict:
    if path is None:
        return {}
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise Refusal(f"--throughput {path}: not a readable JSON file ({err}). Fix: pass a JSON object.") from None
    if not isinstance(table, dict):
        raise Refusal(f"--throughput {path}: a JSON object is needed, e.g. {json.dumps(THROUGHPUT)}")
    known = set(THROUGHPUT) | set(TYPICAL) | {"prepare_s"}
    unknown = {k for k, v in table.items() if not isinstance(v, dict)} - known
    unknown |= {f"{model}.{k}" for model, v in table.items() if isinstance(v, dict) for k in v if k not in known}
    if unknown:
        raise Refusal(f"--throughput {path}: unknown keys {sorted(unknown)}; use {sorted(known)}")
    return table
