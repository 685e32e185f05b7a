# Publishing uploads, so it is its own target (`snakemake publish`), never part of `all`.
# A local rule: on a cluster it runs on the submit host, which has the network and HF_TOKEN.
# Defaults as in config/schema.json: a dry run unless the config says otherwise.
PUBLISH = {"namespace": "", "dataset_repo": None, "private": False, "dry_run": True, "license": "apache-2.0",
           **config.get("publish", {})}


def published_surrogates(wc=None):
    """Folders of every trained surrogate; an empty namespace fails when publish is requested."""
    if not PUBLISH["namespace"]:
        fail("publish.namespace is empty: set it to your Hub user or organisation (e.g. --config publish=\"{namespace: me}\").")
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
        surrogates=lambda wc: published_surrogates(),
        publish=PUBLISH,  # any change of the publish settings reruns this job
        dataset=f"--dataset-repo {PUBLISH['dataset_repo']}" if PUBLISH["dataset_repo"] else "",
        flags=("--dry-run " if PUBLISH["dry_run"] else "") + ("--private" if PUBLISH["private"] else ""),
    log:
        "logs/publish.log",
    localrule: True
    shell:
        "{PYTHON} -m kvzap.publish --out {RESULTS}/publish --namespace {params.publish[namespace]:q} "
        "--license {params.publish[license]:q} {params.dataset} {params.flags} "
        "--surrogates {params.surrogates} --tables {input.tables} > {log} 2>&1"
