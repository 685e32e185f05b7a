"""The cost forecast (kvzap.plan.forecast): tokens counted from the config, both layouts, refusals of bad tables."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from kvzap.plan import forecast
from kvzap.refusal import Refusal
from plan_helpers import ROOT
from plan_helpers import planned as _planned


def planned(name: str) -> dict:
    return _planned(yaml.safe_load((ROOT / "config" / name).read_text()))


def _rows(config, **throughput):
    return {(r["layout"], r["stage"], r["model"]): r for r in forecast.forecast(config, throughput)}


def test_ci_config_counted_by_hand():
    config = planned("ci.yaml")  # ruler-512: 1 task x 1 sample, 12 new tokens; full, kvzap_linear, kvzap_mlp, knorm
    rows = _rows(config, job_start_s=0.0, prefill_tokens_per_s=512.0, decode_step_s=1.0)
    alone, shared = rows[("per-cell", "evaluate", "smollm2-135m")], rows[("shared", "evaluate", "smollm2-135m")]
    assert (alone["jobs"], shared["jobs"]) == (4, 1)  # the four cells share one prefill group
    assert alone["prefill Mtok"] == round(4 * 512 / 1e6, 2) and shared["prefill Mtok"] == round(512 / 1e6, 2)
    assert alone["new Mtok (max)"] == shared["new Mtok (max)"]  # the same answers, decoded in fewer batches
    # 512 tokens at 512 tokens/s per prefill, one 1-s step per new token and decode batch
    cost = forecast._evaluation(config, forecast.TYPICAL, shared=True)["smollm2-135m"]
    assert (cost.prefill_tokens, cost.decode_steps_max) == (512, 12)  # one prefill, one batch of 4 rows, 12 steps
    assert forecast._evaluation(config, forecast.TYPICAL, shared=False)["smollm2-135m"].decode_steps_max == 4 * 12
    assert alone["GPU-h (max)"] >= shared["GPU-h (max)"]


def test_paper_config_shares_most_prefills():
    rows = _rows(planned("paper.yaml"))
    alone, shared = rows[("per-cell", "all", "all")], rows[("shared", "all", "all")]
    assert shared["jobs"] < alone["jobs"] / 2 and shared["prefill Mtok"] < alone["prefill Mtok"] * 0.6
    assert shared["GPU-h (expected)"] < alone["GPU-h (expected)"]


def test_aime_batches_divide_its_decoding_steps():
    config = planned("paper.yaml")
    batched = forecast._evaluation(config, forecast.TYPICAL, shared=True)
    config["evaluation"]["batch_size"] = {}
    alone = forecast._evaluation(config, forecast.TYPICAL, shared=True)
    aime_steps = 30 * 4 * 32_000 * 9  # 30 problems x 4 rollouts, 32,000 new tokens; full and 2 x 4 KVzap thresholds
    assert alone["qwen3-8b"].decode_steps_max - batched["qwen3-8b"].decode_steps_max == aime_steps - aime_steps / 8
    assert alone["llama-3.1-8b-instruct"].decode_steps_max == batched["llama-3.1-8b-instruct"].decode_steps_max


def test_a_prefill_groups_samples_decode_together():
    config = planned("ci.yaml")  # one group of 4 cells (full, kvzap_linear, kvzap_mlp, knorm), 12 new tokens
    config["evaluation"]["benchmarks"]["ruler-512"]["n_samples"] = 8
    config["evaluation"]["batch_size"] = {"smollm2-135m": 8}  # rows: 2 samples x 4 cells per decode
    cost = forecast._evaluation(config, forecast.TYPICAL, shared=True)["smollm2-135m"]
    assert (cost.prefill_tokens, cost.decode_steps_max) == (8 * 512, 4 * 12)  # 8 prefills, 4 decodes of 12 steps


def test_a_per_model_throughput_applies_to_that_model_only():
    config = planned("paper.yaml")
    base, slower = _rows(config), _rows(config, **{"qwen3-32b": {"prefill_tokens_per_s": 6_000}})
    key = ("shared", "evaluate", "qwen3-32b")
    assert slower[key]["GPU-h (expected)"] > base[key]["GPU-h (expected)"]
    other = ("shared", "evaluate", "qwen3-8b")
    assert slower[other]["GPU-h (expected)"] == base[other]["GPU-h (expected)"]


@pytest.mark.parametrize(
    "content, message",
    [("not json", "not a readable JSON file"), ("[1]", "a JSON object"), ('{"speed": 1}', "unknown keys")],
)
def test_bad_throughput_tables_are_refused(tmp_path, content, message):
    path = tmp_path / "t.json"
    path.write_text(content)
    with pytest.raises(Refusal, match=message):
        forecast.read_throughput(path)


def test_cli_prints_the_table(tmp_path):
    table = tmp_path / "t.json"
    table.write_text(json.dumps({"job_start_s": 30}))
    out = subprocess.run(
        [sys.executable, "-m", "kvzap.plan", "config/ci.yaml", "--forecast", "--throughput", str(table)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "per-cell" in out and "shared" in out and "GPU-h (expected)" in out
