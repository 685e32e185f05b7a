"""benchmarks/serving.py runs small on CPU: every batch it records fits the budget, and each row holds about its
kept share of the full cache's bytes."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_serving_script_runs_small_on_cpu(tmp_path):
    out = tmp_path / "serving.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "serving.py"), "--threads", "1", "--prompt-tokens", "96"]
        + [
            "--new-tokens",
            "3",
            "--window",
            "16",
            "--budget-rows",
            "2",
            "--calibration-prompts",
            "1",
            "--out",
            str(out),
        ],
        check=True,
        env=env,
        cwd=ROOT / "benchmarks",
        capture_output=True,
        text=True,
    )
    full, *pruned = json.loads(out.read_text())
    assert full["method"] == "full" and full["batch"] == 2 and full["max_batch_vs_full"] == 1.0
    for record, target in zip(pruned, (0.5, 0.75)):
        assert record["target_ratio"] == target and abs(record["compression_ratio"] - target) < 0.2
        assert record["within_budget"] and record["batch_kv_bytes"] <= record["budget_bytes"]
        assert record["max_batch_vs_full"] == record["batch"] / full["batch"] >= 1
        # kept entries plus the 16-token window (of 99 tokens) and a little spare room
        assert record["bytes_per_row_vs_full"] < 1 - record["compression_ratio"] + 16 / 99 + 0.1
        assert {"tokens_per_s_vs_full", "compression_ratio", "max_batch_vs_full"} <= set(record)
    assert pruned[1]["batch"] > pruned[0]["batch"] > full["batch"] - 1
