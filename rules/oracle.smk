rule oracle_data:
    """KVzip+ oracle scores and attention inputs on the training corpus, streamed to shards (resumable)."""
    input:
        paths.model_json(RESULTS, "{model}"),
    output:
        train=paths.oracle_manifest(RESULTS, "{model}", "train"),
        test=paths.oracle_manifest(RESULTS, "{model}", "test"),
    log:
        log_file("oracle", "{model}"),
    priority: 10  # the critical path: run before evaluation cells that do not wait for it
    conda:
        ENV
    threads: model_resource("oracle", "cpus")
    resources:
        **stage_resources("oracle"),
    params:
        args=lambda wc: commands.oracle_args(config, wc.model),
        out=lambda wc: paths.oracle_dir(RESULTS, wc.model),
    shell:
        "OMP_NUM_THREADS={threads} python -m kvzap.training.collect --model {input} {params.args} "
        "--out {params.out} > {log} 2>&1"
