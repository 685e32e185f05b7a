rule train_surrogate:
    """KVzap-Linear (ridge) or KVzap-MLP on the oracle shards, with R^2 per (layer, head) on held-out prompts."""
    input:
        train=paths.oracle_manifest(RESULTS, "{model}", "train"),
        test=paths.oracle_manifest(RESULTS, "{model}", "test"),
    output:
        **{
            name: f"{paths.surrogate_dir(RESULTS, '{model}', '{kind}')}/{name}.{suffix}"
            for name, suffix in (
                ("model", "safetensors"),
                ("config", "json"),
                ("metrics", "json"),
                ("test_predictions", "safetensors"),
            )
        },
    log:
        log_file("train", "{model}-{kind}"),
    priority: 10  # the critical path: run before evaluation cells that do not wait for it
    conda:
        ENV
    threads: model_resource("train", "cpus")
    resources:
        **stage_resources("train"),
    params:
        args=lambda wc: commands.train_args(config, wc.model, wc.kind),  # only this kind's settings: alpha reruns linear alone
        data=lambda wc: paths.oracle_dir(RESULTS, wc.model),
    shell:
        "OMP_NUM_THREADS={threads} python -m kvzap.training.fit {params.args} --data {params.data} "
        "--out $(dirname {output.model}) > {log} 2>&1"


# Another seed of training.seeds (the MLP's), beside the first's folder: surrogates/<kind>-seed<seed>/.
use rule train_surrogate as train_surrogate_seed with:
    output:
        **{
            name: f"{paths.surrogate_dir(RESULTS, '{model}', '{kind}', '{seed}')}/{name}.{suffix}"
            for name, suffix in (
                ("model", "safetensors"),
                ("config", "json"),
                ("metrics", "json"),
                ("test_predictions", "safetensors"),
            )
        },
    log:
        log_file("train", "{model}-{kind}-seed{seed}"),
    params:
        args=lambda wc: commands.train_args(config, wc.model, wc.kind, int(wc.seed)),
        data=lambda wc: paths.oracle_dir(RESULTS, wc.model),
