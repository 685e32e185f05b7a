# One job per (model, benchmark entry, method, value, shard), covering every subset of the entry: the model is
# loaded once for all 21 LongBench subsets, not 21 times. An entry with `shards: 1` writes its cells directly; a
# split entry writes per-subset shard folders, and one local merge per (model, entry, method, value) joins and
# scores each subset's shards into its cell.


def evaluate_inputs(wc):
    inputs = {"model": f"{RESULTS}/{wc.model}/model.json"}
    surrogate = registry.METHODS[wc.method].surrogate
    if surrogate:
        inputs["surrogate"] = f"{surrogate_dir(wc.model, surrogate)}/model.safetensors"
    return inputs


def cell_files(bench, name, shard="{shard}", n_shards=None):
    """Per-subset files of one job (wildcards model, method, value left open), shard folders or the cells."""
    spec = config["evaluation"]["benchmarks"][bench]
    folder = "" if n_shards in (None, 1) else f"/shards/{shard}-of-{n_shards}"
    return [f"{RESULTS}/{{model}}/eval/{bench}/{subset}/{{method}}/{{value}}{folder}/{name}" for subset in spec["subsets"]]


for BENCH, SPEC in config["evaluation"]["benchmarks"].items():
    RULE_ID = BENCH.replace("-", "_").replace(".", "_")

    rule:
        name:
            f"evaluate_{RULE_ID}"
        input:
            unpack(evaluate_inputs),
        output:
            cell_files(BENCH, "metrics.json", n_shards=SPEC["shards"]) + cell_files(BENCH, "predictions.csv", n_shards=SPEC["shards"]),
        params:
            args=lambda wc, bench=BENCH, n=SPEC["shards"]: plan.evaluate_args(
                config, wc.model, bench, wc.method, wc.value, int(wc.get("shard", 0)), n),
        conda:
            ENV
        log:
            f"{LOGS}/evaluate/{{model}}/{BENCH}/{{method}}/{{value}}/{{shard}}-of-{SPEC['shards']}.log"
            if SPEC["shards"] > 1 else f"{LOGS}/evaluate/{{model}}/{BENCH}/{{method}}/{{value}}.log",
        threads: model_resource("evaluate", "cpus")
        resources:
            **slurm_placement(),
            gpu=model_resource("evaluate", "gpu"),
            mem_mb=model_resource("evaluate", "mem_mb"),
            runtime=model_resource("evaluate", "runtime"),
        shell:
            "OMP_NUM_THREADS={threads} {PYTHON} -m kvzap.evaluate --model {input.model} {params.args} > {log} 2>&1"

    if SPEC["shards"] == 1:
        continue

    rule:
        name:
            f"merge_{RULE_ID}"
        input:
            lambda wc, bench=BENCH, n=SPEC["shards"]: [f.format(model=wc.model, method=wc.method, value=wc.value) for k in range(n) for f in cell_files(bench, "metrics.json", k, n)],
        output:
            cell_files(BENCH, "metrics.json") + cell_files(BENCH, "predictions.csv"),
        params:
            args=lambda wc, bench=BENCH: plan.merge_args(config, wc.model, bench, wc.method, wc.value),
        conda:
            ENV
        log:
            f"{LOGS}/merge/{{model}}/{BENCH}/{{method}}/{{value}}.log",
        localrule: True
        shell:
            "{PYTHON} -m kvzap.merge {params.args} > {log} 2>&1"
