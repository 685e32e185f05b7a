"""The evaluation stage against its floor. The demo's prefill-group job (one shard, the DAG's own command line) is
timed whole, as a process: start-up, model load, presses, prefill, kept entries, batched decode, outputs. Its floor
is the bare compute it contains, timed in this process on the same samples: the plain model's prefill of each
chat-templated context, then a decode of the same rows (one per cell) over the same tokens (the question, then
max_new_tokens single-token steps), on a dense cache, with no press and no bookkeeping.

    python benchmarks/eval_floor.py --config config/config.yaml --out benchmarks/cpu/eval_floor.json

Needs the config's trained surrogates (make demo). Each dtype is timed in the same run: --dtypes float32 bfloat16.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
import yaml
from snakemake.utils import validate as fill_defaults
from transformers import DynamicCache

from kvzap import dtypes
from kvzap.atomic import atomic_write_json
from kvzap.evaluation.shared_prefill import pipeline_prompt
from kvzap.evaluation.suites import benchmark_module
from kvzap.plan import jobs, paths, sweep
from kvzap.plan.schema import SCHEMA, validate
from kvzap.prepare.models import load
from records import cpu_flags, output_file, positive_int, print_table

COLUMNS = ["dtype", "samples", "cells", "job_s", "floor_s", "job_over_floor", "prefill_s", "decode_s"]


def prefill_group(config: dict) -> sweep.EvalJob:
    groups = [j for j in sweep.eval_jobs(config) if j.group is not None]
    if not groups:
        raise SystemExit("The config has no prefill group (methods that prune after attention) to time.")
    return groups[0]


def time_job(config: dict, group: sweep.EvalJob, dtype: str, threads: int, shard: int, n_shards: int) -> float:
    """Wall seconds of the job's process, as the DAG runs it, writing into a scratch folder."""
    spec = jobs.evaluate_spec({**config, "models": _with_dtype(config, dtype)}, group, shard, n_shards)
    with tempfile.TemporaryDirectory() as scratch:
        cells = [replace(c, outs={s: f"{scratch}/{i}/{s}" for s in c.outs}) for i, c in enumerate(spec.cells)]
        spec = replace(spec, cells=tuple(cells))
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        start = time.perf_counter()
        subprocess.run(
            [sys.executable, "-m", "kvzap.evaluation.job", "--spec", spec.to_json()],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        return time.perf_counter() - start


def _with_dtype(config: dict, dtype: str) -> dict:
    return {name: {**model, "dtype": dtype} for name, model in config["models"].items()}


@torch.no_grad()
def time_floor(config: dict, group: sweep.EvalJob, dtype: str, shard: int, n_shards: int) -> tuple[float, float, int]:
    """(prefill seconds, decode seconds, samples) of the bare forwards of the job's share of the samples."""
    from transformers import pipeline

    bench_config = config["evaluation"]["benchmarks"][group.bench]
    model, tokenizer = load(paths.model_json(config["results"], group.model), dtype=dtype)
    bench = benchmark_module(bench_config["benchmark"])
    options = {"tasks": bench_config["tasks"]} if bench_config.get("tasks") else {}
    rows = bench.load(
        bench_config["source"], bench_config["subsets"][0], tokenizer, bench_config["n_samples"], 42, **options
    )
    rows = rows.iloc[shard::n_shards].reset_index(drop=True)
    if bench_config.get("max_new_tokens"):
        rows["max_new_tokens"] = rows["max_new_tokens"].clip(upper=bench_config["max_new_tokens"])
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device=model.device)
    cells = len(group.cells)
    stop = model.generation_config.eos_token_id
    stops = torch.tensor(stop if isinstance(stop, list) else [stop], device=model.device)
    prefill_s = decode_s = 0.0
    for row in rows.itertuples():
        context_ids, question = pipeline_prompt(pipe, row, model.device)
        start = time.perf_counter()
        cache = DynamicCache(config=model.config)
        model.model(input_ids=context_ids, past_key_values=cache)
        prefill_s += time.perf_counter() - start
        start = time.perf_counter()
        cache.batch_repeat_interleave(cells)
        ids = torch.tensor([question] * cells, device=model.device)
        logits = model(input_ids=ids, past_key_values=cache, logits_to_keep=1).logits
        for _ in range(int(row.max_new_tokens) - 1):  # the job's last token needs no forward after it
            ids = logits[:, -1].argmax(-1, keepdim=True)
            if bool(torch.isin(ids, stops).all()):  # as the job, which stops when every row has ended
                break
            logits = model(input_ids=ids, past_key_values=cache, logits_to_keep=1).logits
        decode_s += time.perf_counter() - start
    return prefill_s, decode_s, len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=Path("config/config.yaml"))
    parser.add_argument(
        "--dtypes", nargs="+", default=["float32", dtypes.resolve("auto")], choices=sorted(dtypes.NAMES)
    )
    parser.add_argument("--threads", type=positive_int, default=1, help="as the DAG's evaluation jobs (cpus: 1)")
    parser.add_argument("--out", type=output_file, required=True)
    args = parser.parse_args()
    config = yaml.safe_load(args.config.read_text())
    validate(config)
    fill_defaults(config, str(SCHEMA))
    group = prefill_group(config)
    n_shards = config["evaluation"]["benchmarks"][group.bench]["shards"]
    torch.set_num_threads(args.threads)
    records = []
    for dtype in dict.fromkeys(args.dtypes):
        job_s = time_job(config, group, dtype, args.threads, 0, n_shards)
        prefill_s, decode_s, samples = time_floor(config, group, dtype, 0, n_shards)
        floor = prefill_s + decode_s
        records.append(
            {
                "dtype": dtype,
                "samples": samples,
                "cells": len(group.cells),
                "job_s": job_s,
                "floor_s": floor,
                "job_over_floor": job_s / floor,
                "prefill_s": prefill_s,
                "decode_s": decode_s,
            }
        )
        print_table(records[-1:], COLUMNS)
    print_table(records, COLUMNS)
    machine = {"cpu_flags": cpu_flags()}
    machine["torch_cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    atomic_write_json(args.out, {"config": str(args.config), "threads": args.threads, **machine, "records": records})


if __name__ == "__main__":
    main()
