rule oracle_data:
    """KVzip+ oracle scores and attention inputs on the training corpus, streamed to shards (resumable)."""
    input:
        f"{RESULTS}/{{model}}/model.json",
    output:
        train=f"{RESULTS}/{{model}}/oracle/train/manifest.json",
        test=f"{RESULTS}/{{model}}/oracle/test/manifest.json",
    params:
        oracle=config["oracle"],
        dtype=lambda wc: config["models"][wc.model]["dtype"],
        seed=config["seed"],
    log:
        "logs/oracle/{model}.log",
    threads: model_resource("oracle", "cpus", 1)
    resources:
        **slurm_placement(),
        gpu=model_resource("oracle", "gpu", 0),
        mem_mb=model_resource("oracle", "mem_mb", 16000),
        runtime=model_resource("oracle", "runtime", 120),
    shell:
        "{PYTHON} -m kvzap.collect --model {input} --corpus {params.oracle[corpus]:q} "
        "--min-tokens {params.oracle[min_tokens]} --max-tokens {params.oracle[max_tokens]} "
        "--n-test {params.oracle[n_test]} --n-train {params.oracle[n_train]} "
        "--tokens-per-prompt {params.oracle[tokens_per_prompt]} --shard-tokens {params.oracle[shard_tokens]} "
        "--dtype {params.dtype} --seed {params.seed} --out {RESULTS}/{wildcards.model}/oracle > {log} 2>&1"
