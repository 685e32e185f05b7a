# App. A's surrogate-input ablation: ridge from (k, v) vs from h, on its own oracle collection that stores k and v.


rule oracle_kv_data:
    """Oracle data for the (k, v)-input ablation: fewer prompts, k and v stored beside h."""
    input:
        f"{RESULTS}/{{model}}/model.json",
    output:
        train=f"{RESULTS}/{{model}}/oracle-kv/train/manifest.json",
        test=f"{RESULTS}/{{model}}/oracle-kv/test/manifest.json",
    params:
        args=lambda wc: plan.oracle_args(config, wc.model, kv_ablation=True),
    conda:
        ENV
    log:
        f"{LOGS}/oracle-kv/{{model}}.log",
    threads: model_resource("oracle", "cpus")
    resources:
        **slurm_placement(),
        gpu=model_resource("oracle", "gpu"),
        mem_mb=model_resource("oracle", "mem_mb"),
        runtime=model_resource("oracle", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} {PYTHON} -m kvzap.collect --model {input} {params.args} --out {RESULTS}/{wildcards.model}/oracle-kv > {log} 2>&1"


rule kv_ablation:
    """Held-out R^2 of ridge surrogates from (k, v) and from h on the same pairs (kvzap.kv_ablation)."""
    input:
        train=f"{RESULTS}/{{model}}/oracle-kv/train/manifest.json",
        test=f"{RESULTS}/{{model}}/oracle-kv/test/manifest.json",
    output:
        f"{RESULTS}/{{model}}/ablations/kv_ablation.json",
    params:
        alpha=config["ablations"]["kv_input"]["alpha"],
    conda:
        ENV
    log:
        f"{LOGS}/ablations/{{model}}-kv.log",
    threads: model_resource("train", "cpus")
    resources:
        **slurm_placement(),
        gpu=model_resource("train", "gpu"),
        mem_mb=model_resource("train", "mem_mb"),
        runtime=model_resource("train", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} {PYTHON} -m kvzap.kv_ablation --data {RESULTS}/{wildcards.model}/oracle-kv --alpha {params.alpha} "
        "--out $(dirname {output}) > {log} 2>&1"


rule training_ablation:
    """R^2 and accuracy at matched compression vs training pairs and sources, Linear and MLP (kvzap.training_ablation)."""
    input:
        model=f"{RESULTS}/{{model}}/model.json",
        train=f"{RESULTS}/{{model}}/oracle/train/manifest.json",
        test=f"{RESULTS}/{{model}}/oracle/test/manifest.json",
    output:
        f"{RESULTS}/{{model}}/ablations/training_pairs.json",
    params:
        args=lambda wc: plan.training_ablation_args(config, wc.model),
    conda:
        ENV
    log:
        f"{LOGS}/ablations/{{model}}-training-pairs.log",
    threads: model_resource("evaluate", "cpus")
    resources:
        **slurm_placement(),
        gpu=model_resource("evaluate", "gpu"),
        mem_mb=model_resource("evaluate", "mem_mb"),
        runtime=model_resource("evaluate", "runtime"),
    shell:
        "OMP_NUM_THREADS={threads} {PYTHON} -m kvzap.training_ablation --model {input.model} {params.args} "
        "--data {RESULTS}/{wildcards.model}/oracle --out {output} > {log} 2>&1"
