"""Hostile configs: every bad value is refused before the first job, with its key, the value and the fix.

Most cases call kvzap.plan directly (what workflow/Snakefile runs at parse time); a few go through `snakemake -n`
to show the refusal happens before any job and that shell payloads never run.
"""

from __future__ import annotations

import copy
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kvzap.plan import checks, commands, errors, jobs, sweep
from kvzap.plan.errors import ConfigError
from plan_helpers import BASE, ROOT, config_files, planned


def refused(change) -> str:
    config = copy.deepcopy(BASE)
    change(config)
    with pytest.raises(errors.ConfigError) as info:
        planned(config)
    message = str(info.value)
    assert message.startswith("Invalid configuration: ") and "Fix: " in message
    return message


def model(c):
    return c["models"]["smollm2-135m"]


def bench(c):
    return c["evaluation"]["benchmarks"]["ruler-512"]


def test_base_config_is_accepted():
    config = planned(BASE)
    assert [c.method for c in sweep.cells(config)] == ["full", "kvzap_linear", "kvzap_mlp", "knorm"]


CASES = {
    # shell payloads and path escapes
    "revision payload": (lambda c: model(c).update(revision="'$(touch pwned)'"), "models.smollm2-135m.revision"),
    "source payload": (lambda c: bench(c).update(source="hub; touch pwned"), "source"),
    "task payload": (lambda c: bench(c).update(tasks=["niah_single_1; touch pwned"]), "tasks.0"),
    "subset payload": (lambda c: bench(c).update(subsets=["512 $(touch pwned)"]), "subsets.0"),
    "subset dot-dot": (lambda c: bench(c).update(subsets=[".."]), "subsets.0"),
    "figure name escape": (lambda c: c["figures"].update({"../../../../x": {"kind": "surrogate_fit"}}), "figures"),
    "results escape": (lambda c: c.update(results="results/../../x"), "results"),
    "results outside": (lambda c: c.update(results="/tmp/x"), "results"),
    "model name escape": (lambda c: c["models"].update({"../m": model(c)}), "models"),
    "benchmark name slash": (lambda c: c["evaluation"]["benchmarks"].update({"a/b": bench(c)}), "benchmarks"),
    "model id payload": (lambda c: model(c).update(id="Qwen/Qwen3-8B;rm -rf ~"), "models.smollm2-135m.id"),
    "corpus payload": (lambda c: c["oracle"].update(corpus="nvidia/x`touch pwned`"), "oracle.corpus"),
    "partition payload": (lambda c: c.update(slurm={"partition": "gpu; touch pwned"}), "slurm.partition"),
    "account payload": (lambda c: c.update(slurm={"account": "$(id)"}), "slurm.account"),
    "license payload": (lambda c: c["publish"].update(license="mit $(touch pwned)"), "publish.license"),
    "namespace payload": (lambda c: c["publish"].update(namespace="me;x"), "publish.namespace"),
    "figure benchmark payload": (lambda c: c["figures"]["ruler_tradeoff"].update(benchmark="../x"), "benchmark"),
    # values that used to fail at run time or silently
    "unknown offline model": (lambda c: model(c).update(id="offline/Nope-1B"), "no such offline model"),
    "unknown corpus": (lambda c: c["oracle"].update(corpus="someone/corpus"), "unknown corpus"),
    "NaN threshold": (lambda c: model(c).update(thresholds=[float("nan")]), "not a finite number"),
    "infinite threshold": (lambda c: model(c).update(thresholds=[float("inf")]), "not a finite number"),
    "NaN ratio": (lambda c: c["evaluation"].update(ratios=[float("nan")]), "evaluation.ratios[0]"),
    "ratio of one": (lambda c: c["evaluation"].update(ratios=[1.0]), "evaluation.ratios.0"),
    "duplicate thresholds": (lambda c: model(c).update(thresholds=[-6, -6.0]), "duplicates entry 0"),
    "duplicate ratios": (lambda c: c["evaluation"].update(ratios=[0.5, 0.50]), "duplicates entry 0"),
    "boolean threshold": (lambda c: model(c).update(thresholds=[True]), "thresholds"),
    "unknown method": (lambda c: c["evaluation"].update(methods=["full", "kvzapp"]), "unknown method"),
    "unknown benchmark method": (lambda c: bench(c).update(methods=["snapkv2"]), "unknown method"),
    "unknown RULER task": (lambda c: bench(c).update(tasks=["niah_single_9"]), "not a RULER task"),
    "hub-only task offline": (lambda c: bench(c).update(tasks=["qa_1"]), "available offline"),
    "non-numeric RULER subset": (lambda c: bench(c).update(subsets=["long"]), "context length"),
    "duplicate subsets": (lambda c: bench(c).update(subsets=["512", "512"]), "listed twice"),
    "duplicate tasks": (lambda c: bench(c).update(tasks=["vt", "vt"]), "listed twice"),
    "unknown LongBench subset": (
        lambda c: c["evaluation"]["benchmarks"].update(
            lb={"benchmark": "longbench", "source": "hub", "subsets": ["qasperr"]}
        ),
        "not a longbench subset",
    ),
    "AIME with tasks": (
        lambda c: c["evaluation"]["benchmarks"].update(
            a={"benchmark": "aime25", "source": "offline", "subsets": ["aime25"], "tasks": ["vt"]}
        ),
        "aime25 has no tasks",
    ),
    "rollouts on RULER": (lambda c: bench(c).update(rollouts=4), "only AIME25"),
    "LongBench offline": (
        lambda c: c["evaluation"]["benchmarks"].update(
            lb={"benchmark": "longbench", "source": "offline", "subsets": ["lcc"]}
        ),
        "no offline source",
    ),
    "missing local folder": (lambda c: bench(c).update(source="local:does/not/exist"), "does not exist"),
    "DuoAttention without a pattern": (
        lambda c: (model(c).update(id="Qwen/Qwen3-8B"), c["evaluation"].update(methods=["full", "duo_attention"])),
        "publishes no head pattern for Qwen/Qwen3-8B",
    ),
    "Hub-only method offline": (lambda c: c["evaluation"].update(methods=["full", "qfilter"]), "needs Hub assets"),
    "shards beyond rows": (lambda c: bench(c).update(shards=3), "more shards than the 1 rows"),
    "benchmark names unknown model": (lambda c: bench(c).update(models=["qwen"]), "not defined under models"),
    "tradeoff without benchmark": (lambda c: c["figures"]["ruler_tradeoff"].pop("benchmark"), "needs benchmark"),
    "distribution without method": (
        lambda c: c["figures"].update(d={"kind": "ratio_distribution", "value": -6}),
        "needs method",
    ),
    "distribution value not swept": (
        lambda c: c["figures"].update(d={"kind": "ratio_distribution", "method": "kvzap_mlp", "value": -4}),
        "not swept",
    ),
    "figure unknown benchmark": (lambda c: c["figures"]["ruler_tradeoff"].update(benchmark="ruler-4k"), "not defined"),
    "figure unknown model": (
        lambda c: c["figures"]["surrogate_fit"].update(models=["qwen"]),
        "not defined under models",
    ),
    "figure method not evaluated": (
        lambda c: c["figures"]["ruler_tradeoff"].update(methods=["snapkv"]),
        "not evaluated",
    ),
    "figure unknown metric": (lambda c: c["figures"]["ruler_tradeoff"].update(metric="f1"), "metric"),
    "figure unknown kind": (lambda c: c["figures"]["ruler_tradeoff"].update(kind="pie"), "kind"),
    "token limits inverted": (
        lambda c: c["oracle"].update(min_tokens=400, max_tokens=300),
        "not below oracle.max_tokens",
    ),
    "unknown top-level key": (lambda c: c.update(evalutation={}), "allowed keys"),
    "table 2 value not swept": (
        lambda c: c.update(tables={"best": {"smollm2-135m": {"method": "kvzap_mlp", "value": -4}}}),
        "not evaluated at",
    ),
    "table 2 unknown model": (
        lambda c: c.update(tables={"best": {"qwen": {"method": "kvzap_mlp", "value": -6}}}),
        "not defined under models",
    ),
    "training ablation unknown model": (
        lambda c: c.update(ablations={"training_pairs": {"models": ["qwen"], "benchmark": "ruler-512"}}),
        "ablations.training_pairs.models[0] = 'qwen': not defined under models",
    ),
    "training ablation unknown benchmark": (
        lambda c: c.update(ablations={"training_pairs": {"models": ["smollm2-135m"], "benchmark": "ruler-4k"}}),
        "ablations.training_pairs.benchmark = 'ruler-4k': not an evaluation.benchmarks entry",
    ),
    "training ablation without benchmark": (
        lambda c: c.update(ablations={"training_pairs": {"models": ["smollm2-135m"]}}),
        "ablations.training_pairs.benchmark = None",
    ),
    "training ablation repeated size": (
        lambda c: c.update(
            ablations={"training_pairs": {"models": ["smollm2-135m"], "benchmark": "ruler-512", "sizes": [100, 100]}}
        ),
        "repeats a size or a source",
    ),
    "training ablation source payload": (
        lambda c: c.update(ablations={"training_pairs": {"sources": ["x=$(id)"]}}),
        "sources.0",
    ),
    "training ablation unknown subset": (
        lambda c: c.update(ablations={"training_pairs": {"sources": ["all", "prose=essay"]}}),
        "ablations.training_pairs.sources[1] = 'prose=essay': 'essay' is not a subset of oracle.corpus",
    ),
    "training ablation ratio 1": (
        lambda c: c.update(ablations={"training_pairs": {"target_ratio": 1}}),
        "target_ratio",
    ),
    "batch size unknown model": (
        lambda c: c["evaluation"].update(batch_size={"qwen": 4}),
        "evaluation.batch_size = 'qwen': not defined under models",
    ),
    "batch size zero": (lambda c: c["evaluation"].update(batch_size={"smollm2-135m": 0}), "batch_size"),
    "training figure without ablation": (
        lambda c: c["figures"].update(t={"kind": "training_pairs"}),
        "ablations.training_pairs.models is empty",
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_hostile_value_is_refused(name):
    change, expected = CASES[name]
    assert expected in refused(change)


PAYLOADS = ["$(touch pwned)", "`touch pwned`", "a; touch pwned", "../../x", "a b", "x'y", "a\nb"]
STRING_FIELDS = {
    "models.<name>": lambda c, v: c["models"].update({v: c["models"].pop("smollm2-135m")}),
    "models.<name>.id": lambda c, v: model(c).update(id=f"org/{v}"),
    "models.<name>.revision": lambda c, v: model(c).update(revision=v),
    "oracle.corpus": lambda c, v: c["oracle"].update(corpus=f"nvidia/{v}"),
    "evaluation.methods": lambda c, v: c["evaluation"].update(methods=[v]),
    "evaluation.benchmarks.<name>": lambda c, v: c["evaluation"]["benchmarks"].update({v: bench(c)}),
    "evaluation.benchmarks.<name>.source": lambda c, v: bench(c).update(source=f"local:{v}"),
    "evaluation.benchmarks.<name>.subsets": lambda c, v: bench(c).update(subsets=[v]),
    "evaluation.benchmarks.<name>.tasks": lambda c, v: bench(c).update(tasks=[v]),
    "evaluation.benchmarks.<name>.methods": lambda c, v: bench(c).update(methods=[v]),
    "evaluation.benchmarks.<name>.models": lambda c, v: bench(c).update(models=[v]),
    "figures.<name>": lambda c, v: c["figures"].update({v: {"kind": "surrogate_fit"}}),
    "figures.<name>.benchmark": lambda c, v: c["figures"]["ruler_tradeoff"].update(benchmark=v),
    "figures.<name>.model": lambda c, v: c["figures"]["surrogate_fit"].update(model=v),
    "figures.<name>.method": lambda c, v: c["figures"].update(
        d={"kind": "ratio_distribution", "method": v, "value": -6}
    ),
    "slurm.partition": lambda c, v: c.update(slurm={"partition": v}),
    "slurm.account": lambda c, v: c.update(slurm={"account": v}),
    "publish.namespace": lambda c, v: c["publish"].update(namespace=v),
    "publish.dataset_repo": lambda c, v: c["publish"].update(dataset_repo=f"me/{v}"),
    "publish.license": lambda c, v: c["publish"].update(license=v),
    "results": lambda c, v: c.update(results=f"results/{v}"),
}


@pytest.mark.parametrize("payload", PAYLOADS)
@pytest.mark.parametrize("field", sorted(STRING_FIELDS))
def test_payload_in_every_string_field_is_refused(field, payload):
    refused(lambda c: STRING_FIELDS[field](c, payload))


def test_labels_round_trip_exactly():
    for value in (-4, -4.0, 0.875, -4.1234567, -6.0000001, -6.0000002, 1e-05, 0.1 + 0.2):
        assert float(sweep.value_label(value)) == float(value)
    assert sweep.value_label(-4) == "-4" and sweep.value_label(0.5) == "0.5"
    assert sweep.value_label(-6.0000001) != sweep.value_label(-6.0000002)
    config = copy.deepcopy(BASE)
    config.pop("tables")
    model(config).update(thresholds=[-6.0000001, -6.0000002, -4.1234567])
    labels = [c.value for c in sweep.cells(planned(config)) if c.method == "kvzap_mlp"]
    assert labels == ["-6.0000001", "-6.0000002", "-4.1234567"]


def test_command_lines_are_quoted_word_lists():
    config = planned(BASE)
    job = sweep.EvalJob("smollm2-135m", "ruler-512", None, (("kvzap_mlp", "-6"),))
    spec = jobs.evaluate_spec(config, job, 0, 1)
    (cell,) = spec.cells
    assert (cell.method, cell.value, spec.subsets) == ("kvzap_mlp", -6.0, ("512",))
    assert cell.outs == {"512": "results/ci/smollm2-135m/eval/ruler-512/512/kvzap_mlp/-6"}  # unsplit: the cell itself

    config["models"]["smollm2-135m"]["revision"] = "it's $(x)"  # as if it had slipped past the checks
    assert shlex.split(commands.prepare_args(config, "smollm2-135m"))[-1] == "--revision=it's $(x)"


def test_training_settings_are_per_surrogate():
    config = planned(BASE)
    model = "smollm2-135m"
    linear, mlp = commands.train_args(config, model, "linear"), commands.train_args(config, model, "mlp")
    config["training"]["alpha"] = 5.0
    assert commands.train_args(config, model, "linear") != linear and commands.train_args(config, model, "mlp") == mlp
    config["training"]["epochs"] = 7
    assert "--epochs 7" in commands.train_args(config, model, "mlp") and "--epochs" not in commands.train_args(
        config, model, "linear"
    )


def test_results_root_that_is_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "ci").write_text("not a folder")
    assert "is not a folder" in refused(lambda c: None)


def _snakemake_dry_run(tmp_path, extra: dict) -> subprocess.CompletedProcess:
    override = tmp_path / "override.yaml"
    override.write_text(yaml.safe_dump(extra))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    return subprocess.run(
        ["snakemake", "-n", "--configfile", "config/ci.yaml", str(override)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.parametrize(
    "extra",
    [
        {
            "models": {
                "smollm2-135m": {
                    "id": "offline/SmolLM2-135M-Instruct",
                    "thresholds": [-6],
                    "revision": "$(touch pwned)",
                }
            }
        },
        {"figures": {"../../../../pwned": {"kind": "surrogate_fit"}}},
        {"evaluation": {"ratios": [float("nan")]}},
    ],
)
def test_snakemake_refuses_before_any_job(tmp_path, extra):
    result = _snakemake_dry_run(tmp_path, extra)
    assert result.returncode != 0
    assert "Invalid configuration: " in result.stderr + result.stdout
    assert "Job stats" not in result.stdout
    assert not (ROOT / "pwned").exists() and not (ROOT.parent / "pwned.png").exists()


def test_kv_ablation_models_must_exist():
    assert "ablations.kv_input.models[0]" in refused(lambda c: c.update(ablations={"kv_input": {"models": ["qwen"]}}))


def test_plan_cli_names_the_line_of_a_yaml_syntax_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("results: results/x\nmodels:\n  a: [1, 2\n  b: 3\n")
    result = subprocess.run([sys.executable, "-m", "kvzap.plan", str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and f'in "{bad}", line 3' in result.stderr


def test_plan_cli_accepts_the_shipped_configs():
    for path in sorted((ROOT / "config").glob("*.yaml")):
        files = [str(f) for f in config_files(path.name)]
        result = subprocess.run([sys.executable, "-m", "kvzap.plan", *files], capture_output=True, text=True)
        assert result.returncode == 0 and "valid" in result.stdout, result.stderr


def test_a_models_own_recipe_changes_its_jobs_alone():
    """Two entries of one model under their own recipes (kvzap.plan.recipe): each job reads its own settings, the
    other's stay the config's, and a bad override is refused under its own key."""
    config = planned(BASE)
    config["models"]["demo-recipe"] = {
        **config["models"]["smollm2-135m"],
        "oracle": {"min_tokens": 400, "max_tokens": 600, "tokens_per_prompt": "all"},
        "training": {"valid_split": "prompts", "keep": "best"},
    }
    own = shlex.split(commands.oracle_args(config, "demo-recipe"))
    base = shlex.split(commands.oracle_args(config, "smollm2-135m"))
    assert own[own.index("--min-tokens") + 1] == "400" and own[own.index("--tokens-per-prompt") + 1] == "all"
    assert base[base.index("--min-tokens") + 1] == str(config["oracle"]["min_tokens"])
    assert "--valid-split prompts --keep best" in commands.train_args(config, "demo-recipe", "mlp")
    assert f"--valid-split {config['training']['valid_split']}" in commands.train_args(config, "smollm2-135m", "mlp")
    config["models"]["demo-recipe"]["oracle"]["min_tokens"] = 700
    with pytest.raises(ConfigError, match=r"models\.demo-recipe\.oracle\.min_tokens = 700"):
        checks.check(config)


def test_an_entrys_own_sweep_replaces_the_models_thresholds_and_the_ratios_there_alone():
    config = planned(BASE)
    entry = copy.deepcopy(config["evaluation"]["benchmarks"]["ruler-512"])
    config["evaluation"]["benchmarks"]["few"] = {
        **entry,
        "methods": ["kvzap_mlp", "kvzap_mlp_head"],
        "thresholds": [-3.0],
        "ratios": [0.75],
    }
    few = {(c.method, c.value) for c in sweep.cells(config) if c.bench == "few"}
    assert few == {("kvzap_mlp", "-3"), ("kvzap_mlp_head", "0.75")}
    others = {c.value for c in sweep.cells(config) if c.bench == "ruler-512" and c.method == "kvzap_mlp"}
    assert others == set(map(sweep.value_label, config["models"]["smollm2-135m"]["thresholds"]))
    assert {c for j in sweep.eval_jobs(config) if j.bench == "few" for c in j.cells} == few
    config["evaluation"]["benchmarks"]["few"]["ratios"] = [1.5]
    with pytest.raises(ConfigError, match=r"evaluation\.benchmarks\.few\.ratios\[0\] = 1\.5"):
        checks.check(config)


def test_plan_cli_prints_one_entrys_cells_as_targets():
    """--targets: exactly the metrics.json of the entry's cells, nothing else on stdout (it feeds snakemake), and an
    unknown entry is refused with the entries there are."""
    files = [str(f) for f in config_files("paper_small_2k.yaml")]
    result = subprocess.run(
        [sys.executable, "-m", "kvzap.plan", *files, "--targets", "ruler-2k"], capture_output=True, text=True
    )
    targets = result.stdout.split()
    assert result.returncode == 0, result.stderr
    assert len(targets) == 10 and all(t.endswith("/metrics.json") and "/ruler-2k/2048/" in t for t in targets)
    assert {t.split("/")[2] for t in targets} == {"smollm2-135m", "smollm2-135m-demo-recipe"}
    wrong = subprocess.run(
        [sys.executable, "-m", "kvzap.plan", *files, "--targets", "ruler-9k"], capture_output=True, text=True
    )
    assert wrong.returncode != 0 and "ruler-2k" in wrong.stderr and "ruler-9k" in wrong.stderr
