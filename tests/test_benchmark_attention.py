"""benchmarks/attention.py run small on CPU: query and prefill records, same code as the measured runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_attention_script_writes_query_and_prefill_records(tmp_path):
    out = tmp_path / "attention.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "attention.py"),
            "--contexts",
            "600",
            "--queries",
            "64",
            "--prefill-contexts",
            "700",
            "--chunk",
            "256",
            "--calibration-tokens",
            "400",
            "--ratios",
            "0.5",
            "--repeats",
            "1",
            "--kernel",
            "decode",  # the query record's chunk through the decoding kernel; the prefill keeps the library's choice
            "--out",
            str(out),
        ],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    )
    query, prefill = json.loads(out.read_text())
    assert query["query_tokens"] == 64 and abs(query["compression_ratio"] - 0.5 * (600 - 128) / 600) < 0.02
    assert prefill["context_tokens"] == 700 and prefill["chunk_tokens"] == 256
    assert query["segment_kernel"] == "decode" and query["logits_max_diff_vs_masking"] <= 1e-4
    assert prefill["segment_kernel"] == "flash"  # CPU, causal multi-token forwards
    assert set(prefill["peak_mb"]) == set(prefill["ms"]) == {"dense", "whole", "chunked"}
    # calibrated on other ids, so near the target; chunks see a pruned cache, so their scores differ a little
    assert abs(prefill["compression_ratio"] - 0.5) < 0.15 and abs(prefill["whole_compression_ratio"] - 0.5) < 0.15
    assert prefill["prefill_peak_mb_vs_full"] == prefill["peak_mb"]["chunked"] / prefill["peak_mb"]["whole"]
    assert prefill["prefill_peak_mb_vs_full"] < 1  # 700 tokens of 4096-wide activations vs 256 at a time


def test_decode_record_compares_with_masking_and_compiles(tmp_path):
    """A decoding step's record: the pruned logits equal masking's, and both forwards also timed compiled."""
    out = tmp_path / "decode.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(ROOT / "benchmarks" / "attention.py"), "--contexts", "600", "--queries", "1"]
    command += ["--ratios", "0.5", "--repeats", "1", "--compile", "--out", str(out)]
    subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    (record,) = json.loads(out.read_text())
    assert record["segment_kernel"] == "decode" and record["logits_max_diff_vs_masking"] <= 1e-4
    assert set(record["compiled_ms"]) == {"full", "pruned"} and min(record["compiled_ms"].values()) > 0
    assert record["compiled_ms_vs_full"] == record["compiled_ms"]["pruned"] / record["compiled_ms"]["full"]
    assert record["cpu_flags"] and record["dtype"] == "float32"


def test_a_kernel_that_cannot_serve_the_forward_is_refused_before_any_work(tmp_path):
    command = [sys.executable, str(ROOT / "benchmarks" / "attention.py"), "--contexts", "600", "--queries", "1"]
    command += ["--kernel", "flash", "--out", str(tmp_path / "x.json")]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.run(command, env=env, capture_output=True, text=True)
    assert run.returncode == 2 and "--kernel flash cannot serve 1-token forwards" in run.stderr
    assert "pick one of decode, rows" in run.stderr and not (tmp_path / "x.json").exists()
