# Evaluation jobs (kvzap.plan.sweep.eval_jobs), each over every subset of its entry, the model loaded once, each run
# with its typed spec (kvzap.evaluation.spec.JobSpec, as JSON: `snakemake -n -p` prints it):
# - the prefill group: the cells of one (model, entry) whose methods prune after attention share one prefill per
#   sample and one batched decode (kvzap.evaluation.shared_prefill);
# - every other cell (KVzip's repeat pass, attention weights, chunked prefill, sampled AIME rollouts) is a job alone.
# An entry with `shards: 1` writes its cells directly; a split entry writes per-subset shard folders, and the local
# rule merge joins and scores one cell's shards into the cell.
# Why a rule per entry and per group, not one static rule: a job's outputs are every (cell, subset) file it writes, and
# their number differs between entries (subsets) and groups (cells); Snakemake takes no outputs from a function. One
# static rule would need a job per subset (the model loaded 21 times for LongBench) or outputs not named by cell (no
# cell as a target, every finished cell rerun).

for BENCH, SPEC in config["evaluation"]["benchmarks"].items():
    RULE_ID = rule_id(BENCH)
    N_SHARDS = SPEC["shards"]
    SHARD_LOG = [f"{{shard}}-of-{N_SHARDS}"] if N_SHARDS > 1 else []
    ALONE = sorted({m for job in EVAL_JOBS if job.bench == BENCH and job.group is None for m, _ in job.cells})

    if ALONE:

        rule:
            name:
                f"evaluate_{RULE_ID}"
            input:
                unpack(evaluate_inputs),
            output:
                cell_files(BENCH, "metrics.json", n_shards=N_SHARDS)
                + cell_files(BENCH, "predictions.csv", n_shards=N_SHARDS),
            log:
                log_file("evaluate", "{model}", BENCH, "{method}", "{value}", *SHARD_LOG),
            wildcard_constraints:
                method="|".join(map(re.escape, ALONE)),
            conda:
                ENV
            threads: model_resource("evaluate", "cpus")
            resources:
                **stage_resources("evaluate"),
            params:
                spec=job_spec(BENCH, N_SHARDS),
            shell:
                "OMP_NUM_THREADS={threads} python -m kvzap.evaluation.job --spec {params.spec:q} > {log} 2>&1"

    for JOB in [job for job in EVAL_JOBS if job.bench == BENCH and job.group is not None]:

        rule:
            name:
                f"evaluate_{RULE_ID}_{rule_id(JOB.model)}_{JOB.group}"
            input:
                **group_inputs(JOB),
            output:
                group_files(JOB, N_SHARDS),
            log:
                log_file("evaluate", JOB.model, BENCH, f"prefill-group-{JOB.group}", *SHARD_LOG),
            conda:
                ENV
            threads: model_resource("evaluate", "cpus", JOB.model)
            resources:
                **stage_resources("evaluate", JOB.model),
            params:
                spec=job_spec(BENCH, N_SHARDS, JOB),
            shell:
                "OMP_NUM_THREADS={threads} python -m kvzap.evaluation.job --spec {params.spec:q} > {log} 2>&1"


rule merge:
    """One cell of an entry split into `shards`: its shard folders joined and scored together, on the submit host."""
    input:
        metrics=lambda wc: shard_files(wc, "metrics.json"),
        predictions=lambda wc: shard_files(wc, "predictions.csv"),
    output:
        metrics=f"{CELL}/metrics.json",
        predictions=f"{CELL}/predictions.csv",
    log:
        log_file("merge", "{model}", "{bench}", "{subset}", "{method}", "{value}"),
    wildcard_constraints:
        bench=sharded_entries(),
        subset="[^/]+",
    localrule: True
    conda:
        ENV
    params:
        shards=lambda wc, input: [os.path.dirname(f) for f in input.metrics],
    shell:
        "python -m kvzap.evaluation.merge --shards {params.shards} --out $(dirname {output.metrics}) > {log} 2>&1"
