# App. A's surrogate-input ablation: ridge from (k, v) vs from h, on its own oracle collection that stores k and v;
# and the training-data ablation (sizes and sources of the training pairs).


rule oracle_kv_data:
    """Oracle data for the (k, v)-input ablation: fewer prompts, k and v stored beside h."""
    input:
        paths.model_json(RESULTS, "{model}"),
    output:
        train=paths.oracle_manifest(RESULTS, "{model}", "train", kv_ablation=True),
        test=paths.oracle_manifest(RESULTS, "{model}", "test", kv_ablation=True),
    log:
        log_file("oracle-kv", "{model}"),
    conda:
        ENV
    threads: model_resource("oracle", "cpus")
    resources:
        **stage_resources("oracle"),
    params:
        args=lambda wc: commands.oracle_args(config, wc.model, kv_ablation=True),
        out=lambda wc: paths.oracle_dir(RESULTS, wc.model, kv_ablation=True),
    shell:
        "OMP_NUM_THREADS={threads} python -m kvzap.training.collect --model {input} {params.args} "
        "--out {params.out} > {log} 2>&1"


rule kv_ablation:
    """Held-out R^2 of ridge surrogates from (k, v) and from h on the same pairs (kvzap.ablations.kv_input)."""
    input:
        train=paths.oracle_manifest(RESULTS, "{model}", "train", kv_ablation=True),
        test=paths.oracle_manifest(RESULTS, "{model}", "test", kv_ablation=True),
    output:
        paths.ablation_file(RESULTS, "{model}", "kv_ablation"),
    log:
        log_file("ablations", "{model}-kv"),
    conda:
        ENV
    threads: model_resource("train", "cpus")
    resources:
        **stage_resources("train"),
    params:
        alpha=config["ablations"]["kv_input"]["alpha"],
        data=lambda wc: paths.oracle_dir(RESULTS, wc.model, kv_ablation=True),
    shell:
        "OMP_NUM_THREADS={threads} python -m kvzap.ablations.kv_input --data {params.data} --alpha {params.alpha} "
        "--out $(dirname {output}) > {log} 2>&1"


rule training_ablation:
    """R^2 and accuracy at matched compression vs training pairs and sources (kvzap.ablations.training_data)."""
    input:
        model=paths.model_json(RESULTS, "{model}"),
        train=paths.oracle_manifest(RESULTS, "{model}", "train"),
        test=paths.oracle_manifest(RESULTS, "{model}", "test"),
    output:
        paths.ablation_file(RESULTS, "{model}", "training_pairs"),
    log:
        log_file("ablations", "{model}-training-pairs"),
    conda:
        ENV
    threads: model_resource("evaluate", "cpus")
    resources:
        **stage_resources("evaluate"),
    params:
        args=lambda wc: commands.training_ablation_args(config, wc.model),
        data=lambda wc: paths.oracle_dir(RESULTS, wc.model),
    shell:
        "OMP_NUM_THREADS={threads} python -m kvzap.ablations.training_data --model {input.model} {params.args} "
        "--data {params.data} --out {output} > {log} 2>&1"
