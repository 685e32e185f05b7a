def evaluate_inputs(wc):
    inputs = {"model": f"{RESULTS}/{wc.model}/model.json"}
    if wc.method in SURROGATE_OF:
        inputs["surrogate"] = f"{surrogate_dir(wc.model, SURROGATE_OF[wc.method])}/model.safetensors"
    return inputs


def evaluate_args(wc):
    """CLI flags of one cell, from its wildcards and its benchmark entry."""
    bench = config["evaluation"]["benchmarks"][wc.bench]
    args = [f"--benchmark {bench['benchmark']}", f"--source {bench['source']}", f"--subset {wc.subset}",
            f"--method {wc.method}", f"--dtype {config['models'][wc.model]['dtype']}", f"--seed {config['seed']}"]
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


rule evaluate_cell:
    """One (model, benchmark, subset, method, threshold-or-ratio) cell: predictions and metrics."""
    input:
        unpack(evaluate_inputs),
    output:
        metrics=f"{RESULTS}/{{model}}/eval/{{bench}}/{{subset}}/{{method}}/{{value}}/metrics.json",
        predictions=f"{RESULTS}/{{model}}/eval/{{bench}}/{{subset}}/{{method}}/{{value}}/predictions.csv",
    params:
        args=evaluate_args,
        benchmark=lambda wc: config["evaluation"]["benchmarks"][wc.bench],
    log:
        "logs/evaluate/{model}/{bench}/{subset}/{method}/{value}.log",
    threads: model_resource("evaluate", "cpus", 1)
    resources:
        **slurm_placement(),
        gpu=model_resource("evaluate", "gpu", 0),
        mem_mb=model_resource("evaluate", "mem_mb", 16000),
        runtime=model_resource("evaluate", "runtime", 120),
    shell:
        "{PYTHON} -m kvzap.evaluate --model {input.model} {params.args} "
        "--out {RESULTS}/{wildcards.model}/eval/{wildcards.bench}/{wildcards.subset}/{wildcards.method}/{wildcards.value} "
        "> {log} 2>&1"
