# Publishing uploads, so it is its own target (`snakemake publish`), never part of `all`.
# A local rule: on a cluster it runs on the submit host, which has the network and HF_TOKEN.
PUBLISH = config["publish"]  # defaults from config/schema.json


def published_surrogates(wc=None):
    """Folders of every trained surrogate; an empty namespace fails when publish is requested."""
    if not PUBLISH["namespace"]:
        plan.fail("publish.namespace", "", "empty, and `snakemake publish` needs it",
                  'set it to your Hub user or organisation (e.g. --config publish="{namespace: me}")')
    return [surrogate_dir(m, k) for m in config["models"] for k in config["training"]["surrogates"]]


rule publish:
    """Each surrogate -> Hub model repo <namespace>/KVzap-{kind}-<model> with a model card; tables -> Hub dataset.

    With publish.dry_run the exact folders are written under results/publish/ and nothing is uploaded.
    """
    input:
        surrogates=lambda wc: [f"{d}/{f}" for d in published_surrogates() for f in ("model.safetensors", "config.json", "metrics.json")],
        tables=[f"{RESULTS}/tables/{name}.csv" for name in ("results", "surrogates", "best")],
    output:
        f"{RESULTS}/publish/plan.json",
    params:
        args=lambda wc: plan.publish_args(config, published_surrogates()),
    conda:
        ENV
    log:
        f"{LOGS}/publish.log",
    localrule: True
    shell:
        "{PYTHON} -m kvzap.publish --out {RESULTS}/publish {params.args} --tables {input.tables} > {log} 2>&1"
