rule train_surrogate:
    """KVzap-Linear (ridge) or KVzap-MLP on the oracle shards, with R^2 per (layer, head) on held-out prompts."""
    input:
        train=f"{RESULTS}/{{model}}/oracle/train/manifest.json",
        test=f"{RESULTS}/{{model}}/oracle/test/manifest.json",
    output:
        weights=f"{RESULTS}/{{model}}/surrogates/{{kind}}/model.safetensors",
        config=f"{RESULTS}/{{model}}/surrogates/{{kind}}/config.json",
        metrics=f"{RESULTS}/{{model}}/surrogates/{{kind}}/metrics.json",
        predictions=f"{RESULTS}/{{model}}/surrogates/{{kind}}/test_predictions.safetensors",
    params:
        args=lambda wc: plan.train_args(config, wc.kind),  # only this kind's settings: alpha reruns linear alone
    conda:
        ENV
    log:
        f"{LOGS}/train/{{model}}-{{kind}}.log",
    threads: model_resource("train", "cpus")
    priority: 10  # the critical path: run before evaluation cells that do not wait for it
    resources:
        **slurm_placement(),
        gpu=model_resource("train", "gpu"),
        mem_mb=model_resource("train", "mem_mb"),
        runtime=model_resource("train", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} {PYTHON} -m kvzap.train {params.args} --data {RESULTS}/{wildcards.model}/oracle "
        "--out {RESULTS}/{wildcards.model}/surrogates/{wildcards.kind} > {log} 2>&1"
