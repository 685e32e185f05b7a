# One job per (model, benchmark entry, method, value, shard), covering every subset of the entry: the model is
# loaded once for all 21 LongBench subsets, not 21 times. An entry with `shards: 1` writes its cells directly; a
# split entry writes per-subset shard folders, and one local merge per (model, entry, method, value) joins and
# scores each subset's shards into its cell.

for BENCH, SPEC in config["evaluation"]["benchmarks"].items():
    RULE_ID = BENCH.replace("-", "_").replace(".", "_")
    N_SHARDS = SPEC["shards"]
    JOB_LOG = "{model}", BENCH, "{method}", "{value}"

    rule:
        name:
            f"evaluate_{RULE_ID}"
        input:
            unpack(evaluate_inputs),
        output:
            cell_files(BENCH, "metrics.json", n_shards=N_SHARDS)
            + cell_files(BENCH, "predictions.csv", n_shards=N_SHARDS),
        log:
            log_file("evaluate", *JOB_LOG, f"{{shard}}-of-{N_SHARDS}")
            if N_SHARDS > 1
            else log_file("evaluate", *JOB_LOG),
        conda:
            ENV
        threads: model_resource("evaluate", "cpus")
        resources:
            **stage_resources("evaluate"),
        params:
            args=lambda wc, bench=BENCH, n=N_SHARDS: commands.evaluate_args(
                config, wc.model, bench, wc.method, wc.value, int(wc.get("shard", 0)), n
            ),
        shell:
            "OMP_NUM_THREADS={threads} python -m kvzap.evaluation.job --model {input.model} {params.args} > {log} 2>&1"

    if N_SHARDS == 1:
        continue

    rule:
        name:
            f"merge_{RULE_ID}"
        input:
            shard_metrics(BENCH, N_SHARDS),
        output:
            cell_files(BENCH, "metrics.json") + cell_files(BENCH, "predictions.csv"),
        log:
            log_file("merge", *JOB_LOG),
        localrule: True
        conda:
            ENV
        params:
            args=lambda wc, bench=BENCH: commands.merge_args(config, wc.model, bench, wc.method, wc.value),
        shell:
            "python -m kvzap.evaluation.merge {params.args} > {log} 2>&1"
