"""dtype auto: bfloat16 only where the machine multiplies it natively, float32 elsewhere; names pass through."""

from dataclasses import replace

import pytest
import torch

from kvzap import dtypes


@pytest.fixture
def cpu(monkeypatch):
    def machine(flags: str, capability: str = "AVX512"):
        monkeypatch.setattr(dtypes, "cpu_flags", lambda: frozenset(flags.split()))
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)

    return machine


@pytest.mark.parametrize(
    "flags, capability, expected",
    [
        ("avx2 avx512f amx_bf16 amx_tile", "AVX512", "bfloat16"),
        ("avx2 avx512f avx512_bf16", "AVX512", "bfloat16"),
        ("avx2 avx512f", "AVX512", "float32"),  # AVX-512 without bf16 units
        ("avx2 fma", "AVX2", "float32"),
        ("avx2 avx512f amx_bf16", "AVX2", "float32"),  # ATEN_CPU_CAPABILITY=avx2: bf16 kernels are emulated
        ("", "DEFAULT", "float32"),
    ],
)
def test_auto_on_a_cpu(cpu, flags, capability, expected):
    cpu(flags, capability)
    assert dtypes.resolve("auto", "cpu") == expected


@pytest.mark.parametrize("name", ["float32", "bfloat16", "float16"])
def test_a_named_dtype_is_kept(cpu, name):
    cpu("avx2", "AVX2")
    assert dtypes.resolve(name, "cpu") == name


def test_an_unknown_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="'fp8'"):
        dtypes.resolve("fp8")


def test_cpu_flags_read_from_this_machine():
    flags = dtypes.cpu_flags()
    assert isinstance(flags, frozenset)
    if flags:  # Linux: every x86-64 CPU reports sse2, every arm64 one fp or asimd
        assert flags & {"sse2", "fp", "asimd"}


def test_prepared_model_loads_in_the_resolved_dtype(cpu, tmp_path):
    import json

    from kvzap.prepare import models
    from tiny_models import tiny_model, tiny_tokenizer

    tiny_model("llama").save_pretrained(tmp_path / "hf")
    tiny_tokenizer().save_pretrained(tmp_path / "hf")
    record = tmp_path / "model.json"
    record.write_text(json.dumps({"model_id": "tiny", "path": str(tmp_path / "hf"), "revision": "r0"}))
    cpu("avx2 avx512f amx_bf16", "AVX512")
    model, _ = models.load(record, dtype="auto", device_map="cpu")
    assert next(model.parameters()).dtype == torch.bfloat16
    cpu("avx2", "AVX2")
    model, _ = models.load(record, dtype="auto", device_map="cpu")
    assert next(model.parameters()).dtype == torch.float32


def test_the_schema_offers_the_dtypes_the_jobs_accept():
    import json
    from pathlib import Path

    schema = json.loads((Path(__file__).resolve().parents[1] / "src/kvzap/plan/config.schema.json").read_text())
    dtype = schema["properties"]["models"]["additionalProperties"]["properties"]["dtype"]
    assert tuple(dtype["enum"]) == dtypes.CHOICES and dtype["default"] == "auto"


def test_a_job_refuses_a_bad_dtype_by_name_and_records_the_resolved_one(cpu):
    from kvzap.evaluation.spec import CellSpec, JobError, JobSpec

    spec = JobSpec("m.json", "ruler", ("256",), (CellSpec("full", None, {"256": "o"}),), "m", "r")
    with pytest.raises(JobError, match="dtype 'fp8': use one of"):
        replace(spec, dtype="fp8")
    cpu("avx2", "AVX2")
    assert spec.dtype == "auto" and spec.resolved().dtype == "float32"
