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
    wildcard_constraints:
        kind="linear|mlp",
    params:
        training=config["training"],
        seed=config["seed"],
    log:
        "logs/train/{model}-{kind}.log",
    threads: model_resource("train", "cpus", 1)
    resources:
        **slurm_placement(),
        gpu=model_resource("train", "gpu", 0),
        mem_mb=model_resource("train", "mem_mb", 16000),
        runtime=model_resource("train", "runtime", 60),
    shell:
        "{PYTHON} -m kvzap.train --kind {wildcards.kind} --data {RESULTS}/{wildcards.model}/oracle "
        "--alpha {params.training[alpha]} --epochs {params.training[epochs]} --lr {params.training[lr]} "
        "--batch-size {params.training[batch_size]} --seed {params.seed} "
        "--out {RESULTS}/{wildcards.model}/surrogates/{wildcards.kind} > {log} 2>&1"
