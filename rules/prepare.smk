rule prepare_model:
    """Pin the Hub snapshot, or turn a package-shipped GGUF into a plain HF folder (offline demo)."""
    output:
        f"{RESULTS}/{{model}}/model.json",
    params:
        args=lambda wc: plan.prepare_args(config, wc.model),
    conda:
        ENV
    log:
        f"{LOGS}/prepare/{{model}}.log",
    resources:
        **slurm_placement(),
        gpu=0,
        mem_mb=model_resource("prepare", "mem_mb"),
        runtime=model_resource("prepare", "runtime"),
    shell:
        "{PYTHON} -m kvzap.models {params.args} --out {RESULTS}/{wildcards.model} > {log} 2>&1"
