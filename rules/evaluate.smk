def evaluate_inputs(wc):
    inputs = {"model": f"{RESULTS}/{wc.model}/model.json"}
    if wc.method in SURROGATE_OF:
        inputs["surrogate"] = f"{surrogate_dir(wc.model, SURROGATE_OF[wc.method])}/model.safetensors"
    return inputs


def evaluate_args(wc):
    """CLI flags of one cell shard, from its wildcards and its benchmark entry."""
    bench = config["evaluation"]["benchmarks"][wc.bench]
    args = [f"--benchmark {bench['benchmark']}", f"--source {bench['source']}", f"--subset {wc.subset}",
            f"--method {wc.method}", f"--dtype {config['models'][wc.model]['dtype']}", f"--seed {config['seed']}",
            f"--shard {wc.shard} --n-shards {wc.n_shards}"]
    if wc.value != "none":
        args.append(f"--value {wc.value}")
    if wc.method in SURROGATE_OF:
        args.append(f"--surrogate-{SURROGATE_OF[wc.method]} {surrogate_dir(wc.model, SURROGATE_OF[wc.method])}")
    if bench.get("tasks"):
        args.append("--tasks " + " ".join(bench["tasks"]))
    for key in ("n_samples", "max_new_tokens", "rollouts"):
        if bench.get(key):
            args.append(f"--{key.replace('_', '-')} {bench[key]}")
    return " ".join(args)


CELL = "{model}/eval/{bench}/{subset}/{method}/{value}"


rule evaluate_shard:
    """One shard (rows shard, shard + n, ...) of one (model, benchmark, subset, method, value) cell."""
    input:
        unpack(evaluate_inputs),
    output:
        metrics=f"{RESULTS}/{CELL}/shards/{{shard}}-of-{{n_shards}}/metrics.json",
        predictions=f"{RESULTS}/{CELL}/shards/{{shard}}-of-{{n_shards}}/predictions.csv",
    params:
        args=evaluate_args,
        benchmark=lambda wc: config["evaluation"]["benchmarks"][wc.bench],
    log:
        f"logs/evaluate/{CELL}/{{shard}}-of-{{n_shards}}.log",
    threads: model_resource("evaluate", "cpus", 1)
    resources:
        **slurm_placement(),
        gpu=model_resource("evaluate", "gpu", 0),
        mem_mb=model_resource("evaluate", "mem_mb", 16000),
        runtime=model_resource("evaluate", "runtime", 120),
    shell:
        "{PYTHON} -m kvzap.evaluate --model {input.model} {params.args} "
        "--out $(dirname {output.metrics}) > {log} 2>&1"


rule merge_cell:
    """A cell's shards joined and scored together: the cell's predictions.csv and metrics.json."""
    input:
        lambda wc: cell_shards(wc.model, wc.bench, wc.subset, wc.method, wc.value),
    output:
        metrics=f"{RESULTS}/{CELL}/metrics.json",
        predictions=f"{RESULTS}/{CELL}/predictions.csv",
    log:
        f"logs/merge/{CELL}.log",
    localrule: True
    shell:
        "{PYTHON} -m kvzap.merge --parts $(dirname {input}) --out $(dirname {output.metrics}) > {log} 2>&1"
