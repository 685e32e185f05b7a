rule prepare_model:
    """Pin the Hub snapshot, or turn a package-shipped GGUF into a plain HF folder (offline demo)."""
    output:
        paths.model_json(RESULTS, "{model}"),
    log:
        log_file("prepare", "{model}"),
    conda:
        ENV
    resources:
        **stage_resources("prepare"),
    params:
        args=lambda wc: commands.prepare_args(config, wc.model),
    shell:
        "python -m kvzap.prepare.models {params.args} --out $(dirname {output}) > {log} 2>&1"
