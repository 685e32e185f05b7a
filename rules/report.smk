def all_cell_metrics(wc=None):
    """Every cell; with tables.allow_missing (after a `--keep-going` run) only those that exist now."""
    cells = plan.cell_metrics(config)
    return [c for c in cells if os.path.exists(c)] if config["tables"]["allow_missing"] else cells


def surrogate_metrics(wc=None):
    return [f"{surrogate_dir(m, k)}/metrics.json" for m in config["models"] for k in config["training"]["surrogates"]]


rule aggregate:
    """Every cell and surrogate into the paper's tables (kvzap.aggregate): results, Tables 1-4, ablations, results.md."""
    input:
        cells=all_cell_metrics,
        surrogates=surrogate_metrics,
        models=[f"{RESULTS}/{m}/model.json" for m in config["models"]],
        kv_ablations=plan.kv_ablation_files(config),
        training_ablations=plan.training_ablation_files(config),
    output:
        **{name: f"{RESULTS}/tables/{name}.csv" for name in plan.TABLES},
        markdown=f"{RESULTS}/tables/results.md",
        provenance=f"{RESULTS}/tables/provenance.json",
    params:
        args=lambda wc: plan.aggregate_args(config),
    conda:
        ENV
    log:
        f"{LOGS}/aggregate.log",
    resources:
        **slurm_placement(),
        gpu=0,
        mem_mb=4000,
        runtime=30,
    shell:
        "{PYTHON} -m kvzap.aggregate {params.args} --surrogates {input.surrogates} --models {input.models} "
        "--kv-ablations {input.kv_ablations} --training-ablations {input.training_ablations} "
        "--out {RESULTS}/tables > {log} 2>&1"


def figure_predictions(wc):
    files = plan.figure_inputs(config, wc.name)["predictions"]
    return [f for f in files if os.path.exists(f)] if config["tables"]["allow_missing"] else files


rule figure:
    """One figure of the paper (PNG and PDF), from the aggregated tables."""
    input:
        results=f"{RESULTS}/tables/results.csv",
        predictions=figure_predictions,
        surrogates=lambda wc: plan.figure_inputs(config, wc.name)["surrogates"],
        ablations=lambda wc: plan.figure_inputs(config, wc.name)["ablations"],
    output:
        png=f"{RESULTS}/figures/{{name}}.png",
        pdf=f"{RESULTS}/figures/{{name}}.pdf",
    wildcard_constraints:
        name="|".join(map(re.escape, config["figures"])) or "(?!)",
    params:
        args=lambda wc, input: plan.figure_args(config, wc.name, list(input.predictions)),
    conda:
        ENV
    log:
        f"{LOGS}/figures/{{name}}.log",
    resources:
        **slurm_placement(),
        gpu=0,
        mem_mb=4000,
        runtime=30,
    shell:
        "{PYTHON} -m kvzap.figures {params.args} --out {output.png} > {log} 2>&1"
