"""The cost forecast (kvzap.plan.forecast): seconds counted by hand on the CI config, GPU-hours as SLURM bills them,
per-model scaling, the training stage, the machine schedule (kvzap.plan.schedule), the calibration on a tiny model
(kvzap.plan.calibrate), refusals of bad tables and the command line."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
import yaml

from kvzap.plan import forecast, schedule
from kvzap.plan.forecast import Job
from kvzap.refusal import Refusal
from plan_helpers import ROOT
from plan_helpers import planned as _planned

MODEL = "smollm2-135m"
# Round numbers for the CI config (a 512-token context, questions of 128 tokens, answers of 3, read at 512 tokens/s)
BY_HAND = {
    "prefill_tokens_per_s": 512.0,
    "decode_step_s": 1.0,
    "decode_row_s": 0.5,
    "kv_read_bytes_per_s": None,
    "pruned_step_factor": 2.0,
    "oracle_tokens_per_s": 100.0,
    "repeat_tokens_per_s": 256.0,
    "mlp_pair_layers_per_s": 1000.0,
    "linear_pair_layers_per_s": 4000.0,
    "job_start_s": 0.0,
}
TABLE = {MODEL: BY_HAND, "question_tokens": 128, "ruler_answer_tokens": 3}


def planned(name: str) -> dict:
    return _planned(yaml.safe_load((ROOT / "config" / name).read_text()))


def _rows(config, throughput=None):
    return {(r["layout"], r["stage"], r["model"]): r for r in forecast.forecast(config, throughput or {})}


def _stage(config, stage, shared=True, throughput=None):
    return [job for job in forecast.jobs(config, throughput, shared) if job.stage == stage]


def test_ci_evaluation_counted_by_hand():
    """ruler-512: one sample, at most 12 new tokens (3 expected); full, KVzap-Linear, KVzap-MLP, Knorm."""
    config = planned("ci.yaml")
    (group,) = _stage(config, "evaluate", True, TABLE)
    # one context and four cells' questions: 1,024 tokens, 2 s; then one decode of 4 rows, (1 + 3 x 0.5) s a step,
    # doubled (its KVzap rows are pruned)
    assert (group.seconds, group.seconds_max) == (2 + 3 * 5.0, 2 + 12 * 5.0)
    assert group.prefill_tokens == 512 + 4 * 128
    alone = _stage(config, "evaluate", False, TABLE)
    # per cell: its own context and question (1.25 s), 3 one-row steps; KVzap's steps over its pruned cache cost twice
    assert sorted(job.seconds for job in alone) == [1.25 + 3 * 1.0, 1.25 + 3 * 1.0, 1.25 + 3 * 2.0, 1.25 + 3 * 2.0]
    assert sum(job.prefill_tokens for job in alone) == 4 * (512 + 128)


def test_kvzip_pays_its_repetition():
    config = planned("ci.yaml")
    config["evaluation"]["methods"].append("kvzip")
    (kvzip,) = [job for job in _stage(config, "evaluate", True, TABLE) if "kvzip" in job.name]
    assert kvzip.seconds == 1.25 + 512 / 256 + 3 * 1.0  # its prefill, the context repeated, 3 dense steps
    assert kvzip.prefill_tokens == 512 + 128 + 512


def test_ci_oracle_and_training_counted_by_hand():
    """Essays: 4 training + 2 held-out prompts of 250 tokens (200-300), 100 sampled tokens each, 30 layers."""
    config = planned("ci.yaml")
    (oracle,) = _stage(config, "oracle", throughput={MODEL: BY_HAND})
    assert oracle.prefill_tokens == 6 * 250 * 2 and oracle.seconds == 6 * 250 * 2 / 100
    train = {job.name: job.seconds for job in _stage(config, "train", throughput={MODEL: BY_HAND})}
    visits = 4 * 100 * 30
    assert train == {"train linear None": visits / 4000, "train mlp None": visits * 2 / 1000}  # 2 epochs


def test_seeds_make_a_training_job_and_a_decode_row_each():
    config = planned("ci.yaml")
    config["training"]["seeds"] = [1, 2, 3]
    assert sorted(j.name for j in _stage(config, "train")) == ["train linear None"] + [
        f"train mlp {s}" for s in (1, 2, 3)
    ]
    (group,) = _stage(config, "evaluate", True, TABLE)
    assert group.seconds == (512 + 6 * 128) / 512 + 3 * (1 + 5 * 0.5) * 2  # 6 rows: full, Linear, 3 MLP seeds, Knorm
    assert group.new_tokens_max == 6 * 12


def test_gpu_hours_are_gpus_times_wall_time():
    """Qwen3-32B's oracle and evaluation jobs ask SLURM for 2 GPUs each, its training job for 1."""
    rows = _rows(planned("paper.yaml"))
    for stage, gpus in (("oracle", 2), ("train", 1), ("evaluate", 2)):
        row = rows["shared", stage, "qwen3-32b"]
        assert row["GPU-h (expected)"] == pytest.approx(gpus * row["job-h (expected)"], abs=0.11)
    eight = rows["shared", "evaluate", "qwen3-8b"]
    assert eight["GPU-h (expected)"] == pytest.approx(eight["job-h (expected)"], abs=0.11)


def test_the_32b_model_costs_more_per_token_than_the_8b():
    """About 4.5x the FLOPs per token, and 2 GPUs a job: at least 3x the GPU-hours per prefill token."""
    rows = _rows(planned("paper.yaml"))

    def per_token(model):
        row = rows["shared", "evaluate", model]
        return row["GPU-h (expected)"] / row["prefill Mtok"]

    assert per_token("qwen3-32b") >= 3 * per_token("qwen3-8b")
    scale = {row["model"]: row for row in forecast.scaling(planned("paper.yaml"))}
    assert scale["qwen3-32b"]["FLOPs/token vs reference"] == pytest.approx(4.49, abs=0.01)
    assert scale["qwen3-8b"]["FLOPs/token vs reference"] == 1.0


def test_a_models_own_keys_are_taken_as_measured():
    config = planned("paper.yaml")
    speed = forecast.model_speed(config, "qwen3-32b", {"qwen3-32b": {"prefill_tokens_per_s": 6_000}})
    assert speed["prefill_tokens_per_s"] == 6_000  # not scaled again
    overall = forecast.model_speed(config, "qwen3-32b", {"prefill_tokens_per_s": 6_000})
    assert overall["prefill_tokens_per_s"] == pytest.approx(6_000 / 4.49, rel=0.01)  # the reference's, scaled


def test_a_model_without_a_readable_config_is_priced_as_the_reference(monkeypatch):
    from kvzap.plan import geometry

    monkeypatch.setattr(geometry, "model_config", lambda model_id, revision=None: None)
    unknown = geometry.Geometry.of("someone/some-model")
    assert not unknown.known and unknown.flops_per_token == geometry.Geometry.of(geometry.REFERENCE).flops_per_token
    config = planned("ci.yaml")
    config["models"][MODEL]["id"] = "someone/some-model"
    assert forecast.scaling(config)[0]["geometry"] == "unknown: priced as the reference"


def test_a_step_costs_more_with_rows_and_context():
    speed = forecast.model_speed(planned("paper.yaml"), "qwen3-8b", {})
    one, eight = speed.step_s(1, 32_000, pruned=False), speed.step_s(8, 32_000, pruned=False)
    kv = 32_000 * 36 * 8 * 128 * 2 * 2 / 4.8e12  # one row's keys and values at 32k tokens, read at HBM speed
    assert eight - one == pytest.approx(7 * (1 / 25_200 + kv))
    assert speed.step_s(1, 128_000, pruned=False) > one
    assert speed.step_s(1, 32_000, pruned=True) == pytest.approx(1.25 * one)


def test_aime_batches_share_decoding_steps():
    config = planned("paper.yaml")
    batched = sum(j.seconds for j in forecast.jobs(config) if j.model == "qwen3-8b" and j.stage == "evaluate")
    config["evaluation"]["batch_size"] = {}
    alone = sum(j.seconds for j in forecast.jobs(config) if j.model == "qwen3-8b" and j.stage == "evaluate")
    assert alone > 1.5 * batched


def test_paper_config_shares_most_prefills():
    rows = _rows(planned("paper.yaml"))
    alone, shared = rows[("per-cell", "all", "all")], rows[("shared", "all", "all")]
    assert shared["jobs"] < alone["jobs"] / 2 and shared["prefill Mtok"] < alone["prefill Mtok"] * 0.7
    assert shared["GPU-h (expected)"] < alone["GPU-h (expected)"]


def test_schedule_lays_jobs_on_cores():
    """Two cores: the 2-thread oracle alone, then two 1-thread trainings side by side, then the third."""
    jobs = [
        Job("prepare", "m", 0, 1, 10, 10),
        Job("oracle", "m", 0, "all", 100, 100, needs=("prepare",), priority=10),
        *[Job("train", "m", 0, 1, 50, 50, needs=("oracle",)) for _ in range(3)],
        Job("evaluate", "m", 0, 1, 20, 20, needs=("train",)),
    ]
    spans = schedule.stage_spans(jobs, cores=2)
    assert spans == {"prepare": 10, "oracle": 100, "surrogates": 100, "evaluation": 20, "total": 230}
    lone = schedule.run([Job("evaluate", "m", 0, 4, 5, 5, needs=("train",))], cores=2)  # no training: none to wait for
    assert [(start, end) for _, start, end in lone] == [(0, 5)]


def test_calibration_measures_a_tiny_model(tmp_path):
    """Every speed the forecast reads, measured through the jobs' code on a tiny model, and accepted back."""
    from kvzap.plan import calibrate
    from tiny_models import tiny_model, tiny_tokenizer

    config = planned("ci.yaml")
    config["training"]["epochs"] = 1
    tokenizer = tiny_tokenizer()
    speed, found = calibrate.measure(config, MODEL, tiny_model("llama", len(tokenizer)), tokenizer, tmp_path)
    assert 200 < found["oracle_prompt_tokens"] < 300  # the corpus's prompts, between oracle.min_tokens and max_tokens
    assert (found["oracle_train_prompts"], found["oracle_test_prompts"]) == (4, 2)  # an offline corpus, counted
    for key in ("prefill_tokens_per_s", "decode_step_s", "oracle_tokens_per_s", "mlp_pair_layers_per_s"):
        assert 0 < speed[key] < math.inf
    path = tmp_path / "table.json"
    path.write_text(json.dumps({MODEL: speed, **found}))
    table = forecast.read_throughput(path)
    (oracle,) = _stage(config, "oracle", throughput=table)
    start = forecast.model_speed(config, MODEL, table)["job_start_s"]  # not measured here: the default, scaled
    tokens = 6 * found["oracle_prompt_tokens"] * 2
    assert oracle.seconds == pytest.approx(start + tokens / speed["oracle_tokens_per_s"])


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not a readable JSON file"),
        ("[1]", "a JSON object"),
        ('{"speed": 1}', "unknown keys"),
        ('{"qwen3-8b": {"speed": 1}}', "qwen3-8b.speed"),
    ],
)
def test_bad_throughput_tables_are_refused(tmp_path, content, message):
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(Refusal, match=message):
        forecast.read_throughput(path)


def test_cli_prints_the_table_and_the_machine_schedule(tmp_path):
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"job_start_s": 30}))
    command = [sys.executable, "-m", "kvzap.plan", "config/ci.yaml", "--forecast", "--throughput", str(table)]
    out = subprocess.run([*command, "--cores", "2"], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "per-cell" in out and "GPU-h (expected)" in out and "FLOPs/token vs reference" in out
    assert "wall time on 2 cores" in out and "surrogates" in out
    refused = subprocess.run(command[:4] + ["--cores", "2"], capture_output=True, text=True, cwd=ROOT)
    assert refused.returncode != 0 and "add --forecast" in refused.stderr
    no_cores = subprocess.run([*command, "--cores", "0"], capture_output=True, text=True, cwd=ROOT)
    assert no_cores.returncode != 0 and "--cores 0: give the machine's cores" in no_cores.stderr
