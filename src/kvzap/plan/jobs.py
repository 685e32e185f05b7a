"""An evaluation job's typed spec (kvzap.evaluation.spec.JobSpec) from the config: what its rule hands the job."""

from __future__ import annotations

from kvzap.evaluation import methods
from kvzap.evaluation.spec import CellSpec, JobSpec
from kvzap.plan import paths
from kvzap.plan.inputs import surrogate_dirs
from kvzap.plan.sweep import Cell, EvalJob


def evaluate_spec(config: dict, job: EvalJob, shard: int, n_shards: int) -> JobSpec:
    """One evaluation job: its cells (one, or a prefill group) over every subset of its entry, one shard, each
    (cell, subset) writing to its folder (paths.shard_dir)."""
    bench = config["evaluation"]["benchmarks"][job.bench]
    results, evaluation = config["results"], config["evaluation"]
    kinds = {methods.METHODS[m].surrogate for m, _ in job.cells} - {None}
    batch_size = evaluation["batch_size"].get(job.model, 1)
    batches = (job.group is not None or bench["benchmark"] == "aime25") and batch_size > 1
    cells = [
        CellSpec(
            method,
            None if value == "none" else float(value),
            {
                s: paths.shard_dir(results, Cell(job.model, job.bench, s, method, value), shard, n_shards)
                for s in bench["subsets"]
            },
        )
        for method, value in job.cells
    ]
    return JobSpec(
        model=paths.model_json(results, job.model),
        benchmark=bench["benchmark"],
        subsets=tuple(bench["subsets"]),
        cells=tuple(cells),
        model_name=job.model,
        bench_name=job.bench,
        source=bench["source"],
        tasks=tuple(bench["tasks"]) if bench.get("tasks") else None,
        revision=bench.get("revision") or None,
        long_samples=evaluation["long_samples"],
        departures=tuple(evaluation["departures"]),
        **{f"surrogate_{kind}": tuple(surrogate_dirs(config, job.model, kind)) for kind in sorted(kinds)},
        n_samples=bench.get("n_samples") or None,
        max_new_tokens=bench.get("max_new_tokens") or None,
        rollouts=bench.get("rollouts") or None,
        decode_batch=evaluation["decode_batch"] if job.group is not None else None,
        batch_size=batch_size if batches else 1,
        dtype=config["models"][job.model]["dtype"],
        seed=config["seed"],
        shard=shard,
        n_shards=n_shards,
    )
