# Publishing uploads, so it is its own target (`snakemake publish`), never part of `all`.
# A local rule: on a cluster it runs on the submit host, which has the network and HF_TOKEN.


rule publish:
    """Each surrogate -> Hub model repo <namespace>/KVzap-{kind}-<model> with a model card; tables -> Hub dataset.

    With publish.dry_run the exact folders are written under results/publish/ and nothing is uploaded.
    """
    input:
        surrogates=lambda wc: [
            f"{d}/{f}" for d in published_surrogates() for f in ("model.safetensors", "config.json", "metrics.json")
        ],
        tables=[paths.table(RESULTS, name) for name in ("results", "surrogates", "best")],
    output:
        paths.publish_plan(RESULTS),
    log:
        log_file("publish"),
    localrule: True
    conda:
        ENV
    params:
        args=lambda wc: commands.publish_args(config, published_surrogates()),
    shell:
        "python -m kvzap.publish --out $(dirname {output}) {params.args} --tables {input.tables} > {log} 2>&1"
