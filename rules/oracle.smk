rule oracle_data:
    """KVzip+ oracle scores and attention inputs on the training corpus, streamed to shards (resumable)."""
    input:
        f"{RESULTS}/{{model}}/model.json",
    output:
        train=f"{RESULTS}/{{model}}/oracle/train/manifest.json",
        test=f"{RESULTS}/{{model}}/oracle/test/manifest.json",
    params:
        args=lambda wc: plan.oracle_args(config, wc.model),
    conda:
        ENV
    log:
        f"{LOGS}/oracle/{{model}}.log",
    threads: model_resource("oracle", "cpus")
    priority: 10  # the critical path: run before evaluation cells that do not wait for it
    resources:
        **slurm_placement(),
        gpu=model_resource("oracle", "gpu"),
        mem_mb=model_resource("oracle", "mem_mb"),
        runtime=model_resource("oracle", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} {PYTHON} -m kvzap.collect --model {input} {params.args} --out {RESULTS}/{wildcards.model}/oracle > {log} 2>&1"
