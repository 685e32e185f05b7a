"""A forecast's jobs laid on one machine's cores, as Snakemake runs them there: each stage's span from its first job's
start to its last job's end, the quantity `benchmarks/demo_record.py` reads off a real run's log.

Snakemake starts, whenever cores free up, the ready jobs of highest priority that fit (a job takes its `threads`, at
most every core); among equal priorities this follows the order the workflow lists them (prepare, oracle, training,
evaluation, merges, tables), which Snakemake does not promise: a forecast, not a replay.
"""

from __future__ import annotations

import heapq

from kvzap.plan.forecast import Job

# the stages as a run's record names them (benchmarks/demo_record.py)
RECORD_STAGE = {
    "prepare": "prepare",
    "oracle": "oracle",
    "train": "surrogates",
    "evaluate": "evaluation",
    "merge": "evaluation",
    "report": "tables and figures",
}


def _cores(job: Job, cores: int) -> int:
    return cores if job.threads == "all" else min(int(job.threads), cores)


def _ready(job: Job, left: dict[tuple[str, str], int]) -> bool:
    """Every job of the stages it needs has ended (of its model, or of every model for a job of all models); a stage
    with no jobs has nothing to wait for. A job's cores are capped at the machine's, so some job can always start."""
    return all(
        count == 0 for (model, stage), count in left.items() if stage in job.needs and job.model in (model, "all")
    )


def run(jobs: list[Job], cores: int) -> list[tuple[Job, float, float]]:
    """(job, start, end) of every job, seconds from the run's start."""
    left: dict[tuple[str, str], int] = {}
    for job in jobs:
        left[job.model, job.stage] = left.get((job.model, job.stage), 0) + 1
    waiting = list(range(len(jobs)))
    running: list[tuple[float, int]] = []  # (end, index)
    placed, now, free = [], 0.0, cores
    while waiting or running:
        for index in sorted(waiting, key=lambda i: -jobs[i].priority):
            job = jobs[index]
            if _ready(job, left) and _cores(job, cores) <= free:
                free -= _cores(job, cores)
                waiting.remove(index)
                heapq.heappush(running, (now + job.seconds, index))
                placed.append((job, now, now + job.seconds))
        now, index = heapq.heappop(running)
        free += _cores(jobs[index], cores)
        left[jobs[index].model, jobs[index].stage] -= 1
    return placed


def stage_spans(jobs: list[Job], cores: int) -> dict[str, float]:
    """Seconds from each recorded stage's first job start to its last job end, and the whole run's."""
    spans: dict[str, tuple[float, float]] = {}
    for job, start, end in run(jobs, cores):
        stage = RECORD_STAGE[job.stage]
        first, last = spans.get(stage, (start, end))
        spans[stage] = (min(first, start), max(last, end))
    out = {stage: last - first for stage, (first, last) in spans.items()}
    out["total"] = max(last for _, last in spans.values())
    return out
