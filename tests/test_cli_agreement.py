"""The rules' command lines (kvzap.plan) and the modules' CLIs agree: every flag the plan passes parses, and no
setting the plan passes has a second default in a CLI (its one default is in src/kvzap/plan/config.schema.json);
an evaluation job's spec reads back as the planner built it, its cells' folders where the rules expect them."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from snakemake.utils import validate as fill_defaults

from kvzap.evaluation.spec import JobSpec
from kvzap.plan import commands, jobs, overlays, paths, schema, sweep
from kvzap.plan.recipe import recipe
from kvzap.surrogate import settings
from kvzap.training import collect, fit
from plan_helpers import config_files

ROOT = Path(__file__).resolve().parents[1]


def planned(name: str) -> dict:
    config = overlays.load(config_files(name))
    fill_defaults(config, str(schema.SCHEMA))
    return config


def _no_second_default(parser, words: list[str]) -> None:
    for action in parser._actions:
        if any(flag in words for flag in action.option_strings) and action.nargs != 0:
            assert action.default is None, f"{action.option_strings} has a default of its own: {action.default!r}"


@pytest.mark.parametrize("name", sorted(path.name for path in (ROOT / "config").glob("*.yaml")))
def test_plan_command_lines_parse(name):
    config = planned(name)
    for model in config["models"]:  # each with its own recipe, where it has one (kvzap.plan.recipe)
        own = recipe(config, model)
        words = shlex.split(commands.oracle_args(config, model)) + ["--model", "m.json", "--out", "o"]
        args = collect.build_parser().parse_args(words)
        assert (args.min_tokens, args.n_train, args.seed) == (
            own["oracle"]["min_tokens"],
            own["oracle"]["n_train"],
            config["seed"],
        )
        _no_second_default(collect.build_parser(), words)
        for kind in ("linear", "mlp"):
            words = shlex.split(commands.train_args(config, model, kind)) + ["--data", "d", "--out", "o"]
            args = fit.build_parser().parse_args(words)
            for key in settings.TRAINING_KEYS[kind]:
                assert getattr(args, key) == own["training"][key]
            _no_second_default(fit.build_parser(), words)
    for eval_job in sweep.eval_jobs(config)[:50]:
        n_shards = config["evaluation"]["benchmarks"][eval_job.bench]["shards"]
        spec = jobs.evaluate_spec(config, eval_job, 0, n_shards)
        assert JobSpec.read(spec.to_json()) == spec  # what the rule hands the job is what the planner meant
        subsets = config["evaluation"]["benchmarks"][eval_job.bench]["subsets"]
        assert [(c.method, c.value) for c in spec.cells] == [
            (m, None if v == "none" else float(v)) for m, v in eval_job.cells
        ]
        for cell, (method, value) in zip(spec.cells, eval_job.cells):
            expected = {
                s: paths.shard_dir(
                    config["results"], sweep.Cell(eval_job.model, eval_job.bench, s, method, value), 0, n_shards
                )
                for s in subsets
            }
            assert cell.outs == expected
        if eval_job.group is not None:
            assert spec.decode_batch == config["evaluation"]["decode_batch"]
        bench = config["evaluation"]["benchmarks"][eval_job.bench]["benchmark"]
        batched = bench == "aime25" or eval_job.group is not None
        batch_size = config["evaluation"]["batch_size"].get(eval_job.model, 1) if batched else 1
        assert spec.batch_size == batch_size


def test_flags_write_each_setting_once_in_order():
    words = commands.flags(n_train=3, tasks=["a b", "c"], store_kv=True, private=False, revision=None, sizes=[], lr=0.0)
    assert words == ["--n-train", "3", "--tasks", "a b", "c", "--store-kv", "--lr", "0.0"]
    assert shlex.split(shlex.join(words)) == words  # a value with a space stays one word on the command line


def test_aime_and_prefill_group_jobs_get_their_models_batch_size():
    config = planned("rehearsal.yaml")

    def sizes(chosen) -> dict[str, set[int]]:
        out = {}
        for j in chosen:
            out.setdefault(j.model, set()).add(jobs.evaluate_spec(config, j, 0, 1).batch_size)
        return out

    planned_jobs = sweep.eval_jobs(config)
    assert sizes(j for j in planned_jobs if j.bench == "aime25") == {"qwen3-8b": {2}, "qwen3-32b": {1}}
    groups = sizes(j for j in planned_jobs if j.group is not None and j.bench != "aime25")
    assert (
        groups["qwen3-8b"] == {2}
        and groups.keys() > {"qwen3-8b"}
        and all(size == {1} for model, size in groups.items() if model != "qwen3-8b")
    )
    assert all(
        size == {1} for size in sizes(j for j in planned_jobs if j.group is None and j.bench != "aime25").values()
    )


def test_training_kind_needs_its_settings(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["train", "--kind", "mlp", "--data", "d", "--out", "o", "--seed", "1"])
    with pytest.raises(SystemExit):
        fit.main()
    assert "--kind mlp needs --epochs --lr --batch-size" in capsys.readouterr().err
