"""benchmarks/gpu_decode.py, the H200 script (its decode records and its --dtype-agreement record), run small on
CPU: same code, checked records."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvzap.pruning import PrunedLayer, segments
from kvzap.pruning.sliding import SLACK
from varlen_reference import varlen_reference

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_decode_script_runs_small_on_cpu(tmp_path):
    out = tmp_path / "decode.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_decode.py"),
            "--tiny",
            "--layers",
            "1",
            "--device",
            "cpu",
            "--contexts",
            "600",
            "--ratios",
            "0.5",
            "--decode-steps",
            "5",
            "--calibration-tokens",
            "512",
            "--compile",
            "eager",  # dynamo's tracing without a compiler: the compiled path, cheaply
            "--out",
            str(out),
        ],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    )
    [record] = json.loads(out.read_text())
    assert record["context_tokens"] == 600 and set(record["kv_bytes"]) == {"full", "masking", "eviction"}
    assert record["layers"] == 1  # --layers overrides the geometry's depth
    assert record["compile_backend"] == "eager" and set(record["compiled_decode_ms"]) == {"full", "eviction"}
    assert (
        record["compiled_decode_ms_vs_full"]
        == record["compiled_decode_ms"]["eviction"] / record["compiled_decode_ms"]["full"]
    )
    # calibrated on another prompt, so near the target, not on it; masking and eviction judge alike
    assert abs(record["compression_ratio"] - 0.5) < 0.15
    assert abs(record["compression_ratio"] - record["masking_compression_ratio"]) < 1e-9
    # eviction holds the kept entries only, plus per-row bookkeeping and the window's spare room (SLACK of the
    # 128-token window: a visible share at this tiny context, negligible at real ones); masking holds everything
    spare = SLACK * 128 / record["context_tokens"]
    assert record["kv_bytes_vs_full"] < 1 - record["compression_ratio"] + 0.1 + spare
    assert record["kv_bytes"]["masking"] >= record["kv_bytes"]["full"]
    # eviction attends to exactly what masking leaves visible
    assert record["max_abs_logit_diff_vs_masking"] < 1e-4 and record["same_argmax_vs_masking"] == 1.0
    # on CPU the decode kernel serves a decoding step, the flash kernel (or the decode one) a 64-token one
    kernels = record["segment_kernels"]
    assert set(kernels["1_tokens"]["max_abs_diff_vs_float32_rows"]) == {"decode"}
    assert set(kernels["64_tokens"]["max_abs_diff_vs_float32_rows"]) == {"flash", "decode"}
    assert all(diff < 1e-5 for check in kernels.values() for diff in check["max_abs_diff_vs_float32_rows"].values())


def test_kernel_check_catches_a_wrong_kernel_and_passes_the_varlen_one(monkeypatch):
    """The GPU script's check of the varlen kernel, run on CPU against varlen_attn's documented semantics; an
    attention that ignores the causal mask is caught."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_decode

    gen = torch.Generator().manual_seed(0)
    layer = PrunedLayer(*torch.randn(2, 1, 2, 400, 16, generator=gen))
    layer.judge(400 - 128, torch.rand(1, 2, 400 - 128, generator=gen) < 0.5)
    monkeypatch.setattr(segments, "varlen_attn", varlen_reference)
    for tokens, kernels in ((1, ["varlen", "decode"]), (64, ["varlen", "flash", "decode"])):
        check = gpu_decode.kernel_agreement(layer, tokens, group=4, kernels=kernels)
        assert max(check["max_abs_diff_vs_float32_rows"].values()) < 1e-5 and check["output_max_abs"] > 0.1
    monkeypatch.setattr(segments, "varlen_attn", functools.partial(varlen_reference, causal_as_full=True))
    check = gpu_decode.kernel_agreement(layer, 64, group=4, kernels=["varlen"])
    assert check["max_abs_diff_vs_float32_rows"]["varlen"] > 0.05


def test_dtype_agreement_runs_small_on_cpu(tmp_path):
    out = tmp_path / "agreement.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "gpu_decode.py"),
            "--dtype-agreement",
            "--tiny",
            "--device",
            "cpu",
            "--contexts",
            "600",
            "--ratios",
            "0.75",
            "--calibration-tokens",
            "1024",
            "--decode-steps",
            "4",
            "--out",
            str(out),
        ],
        check=True,
        env=env,
        capture_output=True,
        text=True,
    )
    [record] = json.loads(out.read_text())
    assert set(record["bfloat16_vs_float32"]) == {"full", "masking", "eviction"}
    assert record["context_tokens"] == 600 and record["target_ratio"] == 0.75
    assert record["eviction_vs_masking"]["float32"]["max_abs_logit_diff"] < 1e-4
    # bf16 rounding is visible, and small for a 2-layer model
    assert 0 < record["bfloat16_vs_float32"]["full"]["max_abs_logit_diff"] < 0.1


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--dtype-agreement", "--compile", "eager"], "drop --compile and --dtype"),
        (["--compile", "indcutor"], "invalid choice: 'indcutor'"),
    ],
)
def test_options_a_run_would_ignore_or_fail_on_are_refused_first(flags, message, tmp_path):
    script = str(ROOT / "benchmarks" / "gpu_decode.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(
        [sys.executable, script, "--out", str(tmp_path / "x.json"), *flags], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2 and message in done.stderr
