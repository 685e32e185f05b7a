rule aggregate:
    """Every cell and surrogate into the paper's tables (kvzap.report.aggregate): results, Tables 1-4, ablations."""
    input:
        cells=all_cell_metrics,
        surrogates=surrogate_metrics,
        models=[paths.model_json(RESULTS, m) for m in config["models"]],
        kv_ablations=inputs.kv_ablation_files(config),
        training_ablations=inputs.training_ablation_files(config),
    output:
        **table_outputs(),
        markdown=paths.table(RESULTS, "results", "md"),
        provenance=paths.table(RESULTS, "provenance", "json"),
    log:
        log_file("aggregate"),
    conda:
        ENV
    resources:
        **report_resources(),
    params:
        args=lambda wc: commands.aggregate_args(config),
    shell:
        "python -m kvzap.report.aggregate {params.args} --models {input.models} "
        "--kv-ablations {input.kv_ablations} --training-ablations {input.training_ablations} "
        "--out $(dirname {output.markdown}) > {log} 2>&1"


rule figure:
    """One figure of the paper (PNG and PDF), from the aggregated tables."""
    input:
        results=paths.table(RESULTS, "results"),
        predictions=figure_predictions,
        surrogates=lambda wc: inputs.figure_inputs(config, wc.name)["surrogates"],
        ablations=lambda wc: inputs.figure_inputs(config, wc.name)["ablations"],
    output:
        png=report(
            paths.figure(RESULTS, "{name}"),
            caption="../workflow/report/figure.rst",
            category="Figures",
            labels={"figure": "{name}"},
        ),
        pdf=paths.figure(RESULTS, "{name}", "pdf"),
    log:
        log_file("figures", "{name}"),
    wildcard_constraints:
        name="|".join(map(re.escape, config["figures"])) or "(?!)",
    conda:
        ENV
    resources:
        **report_resources(),
    params:
        args=lambda wc, input: commands.figure_args(config, wc.name, list(input.predictions)),
        kind=lambda wc: config["figures"][wc.name]["kind"],
        caption=lambda wc: outputs.FIGURES[config["figures"][wc.name]["kind"]].caption,
    shell:
        "python -m kvzap.report.figures {params.args} --out {output.png} > {log} 2>&1"
