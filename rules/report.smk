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
        "--kv-ablations {input.kv_ablations} "
        "--out {RESULTS}/tables > {log} 2>&1"


def figure_inputs(wc):
    spec = config["figures"][wc.name]
    inputs = [f"{RESULTS}/tables/results.csv"]
    if spec["kind"] == "surrogate_fit":
        for model in spec.get("models") or config["models"]:
            for kind in ("linear", "mlp"):
                inputs += [f"{surrogate_dir(model, kind)}/metrics.json", f"{surrogate_dir(model, kind)}/test_predictions.safetensors"]
    if spec["kind"] == "ratio_distribution":
        inputs += [f"{plan.cell_dir(RESULTS, c)}/predictions.csv" for c in plan.cells(config) if c.method == spec["method"]]
    return inputs


rule figure:
    """One figure of the paper (PNG and PDF), from the aggregated tables."""
    input:
        figure_inputs,
    output:
        png=f"{RESULTS}/figures/{{name}}.png",
        pdf=f"{RESULTS}/figures/{{name}}.pdf",
    wildcard_constraints:
        name="|".join(map(re.escape, config["figures"])) or "(?!)",
    params:
        spec=lambda wc: json.dumps(config["figures"][wc.name]),
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
        "{PYTHON} -m kvzap.figures --results {RESULTS}/tables/results.csv --results-dir {RESULTS} "
        "--spec {params.spec:q} --out {output.png} > {log} 2>&1"
