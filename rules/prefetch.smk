# Downloading is its own target (`snakemake prefetch`, `make prefetch`), never part of `all`: everything the config
# reads from the Hub, into the Hub cache, so that a cluster without network runs the config with HF_HUB_OFFLINE=1.
# A local rule: on a cluster it runs on the submit host, which has the network (and the token a gated model needs).
from kvzap.plan import hub_assets


rule prefetch:
    """Every Hub model, dataset and method asset the config reads, at its pinned revision -> the Hub cache (and the
    datasets cache, DuoAttention's patterns); prints what was fetched."""
    log:
        log_file("prefetch"),
    localrule: True
    conda:
        ENV
    params:
        fetches=lambda wc: hub_assets.manifest(config),
    shell:
        "python -m kvzap.prepare.prefetch --fetches {params.fetches:q} 2>&1 | tee {log}"
