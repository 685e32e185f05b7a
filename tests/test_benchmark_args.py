"""The benchmark scripts refuse a bad command-line value at parse time, naming it (benchmarks/records.py)."""

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from records import nonnegative_int, output_file, output_folder, positive_int, seconds, unit_fraction  # noqa: E402

SCRIPTS = sorted(p for p in (ROOT / "benchmarks").glob("*.py") if p.name != "records.py")
FREE_NUMBERS = {"--seed", "--seeds", "--threshold", "--thresholds"}  # any integer seed, any real threshold


@pytest.mark.parametrize(
    "parse, text, message",
    [
        (positive_int, "0", "0 is below 1: give a whole number of at least 1"),
        (positive_int, "-3", "-3 is below 1"),
        (positive_int, "2.5", "'2.5' is not an integer"),
        (nonnegative_int, "-1", "-1 is below 0: give a whole number of tokens, 0 or more"),
        (unit_fraction, "1", "1.0 is outside [0, 1)"),
        (unit_fraction, "-0.1", "-0.1 is outside [0, 1)"),
        (unit_fraction, "half", "'half' is not a number"),
        (output_file, str(ROOT), "is a folder: give a file path"),
        (output_folder, str(ROOT / "README.md"), "is a file: give a folder path"),
        (seconds, "-1", "-1.0 is not a duration: give 0 or more seconds"),
        (seconds, "soon", "'soon' is not a number: give seconds"),
    ],
)
def test_bad_values_are_refused_by_name(parse, text, message):
    with pytest.raises(argparse.ArgumentTypeError, match=message.replace("[", r"\[").replace(")", r"\)")):
        parse(text)


def test_good_values_pass_through(tmp_path):
    assert (positive_int("4"), nonnegative_int("0"), unit_fraction("0.75")) == (4, 0, 0.75)
    assert output_file(str(tmp_path / "r.json")) == tmp_path / "r.json"
    assert output_folder(str(tmp_path)) == tmp_path


def _typed_flags(script: Path):
    """(flag, type name) of every add_argument call with a type= in the script."""
    for node in ast.walk(ast.parse(script.read_text())):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            kinds = [k.value.id for k in node.keywords if k.arg == "type" and isinstance(k.value, ast.Name)]
            if kinds and node.args and isinstance(node.args[0], ast.Constant):
                yield node.args[0].value, kinds[0]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_count_ratio_and_output_flag_is_checked(script):
    unchecked = [
        (flag, kind)
        for flag, kind in _typed_flags(script)
        if (kind in ("int", "float") and flag not in FREE_NUMBERS) or (flag == "--out" and kind != "output_file")
    ]
    assert not unchecked, f"{script.name}: flags parsed without a check: {unchecked}"


def test_a_script_stops_before_any_work():
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--out", "x.json", "--tokens", "0"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 2
    assert "argument --tokens: 0 is below 1: give a whole number of at least 1" in run.stderr


VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"
RUNNABLE = [p for p in SCRIPTS if '__name__ == "__main__"' in p.read_text()]  # not the shared helper modules
IN_VLLM = {"vllm_engine.py"}  # runs inside the vLLM environment (vllm_serving.py starts it there)


@pytest.mark.parametrize("script", [p for p in RUNNABLE if p.name not in IN_VLLM], ids=lambda p: p.name)
def test_every_script_imports_and_prints_its_help(script, monkeypatch, capsys):
    """A moved or renamed import breaks a script only when it runs: each one imports and parses --help (in this
    process: the libraries are loaded once for all of them)."""
    import runpy

    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(script), run_name="__main__")
    assert stop.value.code == 0 and "usage:" in capsys.readouterr().out


@pytest.mark.parametrize("script", sorted(IN_VLLM))
def test_the_vllm_engine_script_prints_its_help_in_its_environment(script):
    assert VLLM_PYTHON.exists(), f"{VLLM_PYTHON} is missing: `make setup-test` builds the vLLM environment"
    run = subprocess.run(
        [str(VLLM_PYTHON), str(ROOT / "benchmarks" / script), "--help"], capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0 and "usage:" in run.stdout, run.stderr[-2000:]


def test_serving_takes_one_threshold_or_one_per_layout(tmp_path):
    """Each layout prunes by its own rule (per layer the fill, per head KVzap's own), so each may need its own τ; a
    count that matches neither is refused before any engine runs."""
    command = [sys.executable, str(ROOT / "benchmarks" / "vllm_serving.py"), "--workload", "decode-heavy"]
    command += ["--model-json", "m.json", "--surrogate", "s", "--layout", "per_layer", "per_head"]
    run = subprocess.run(
        command + ["--threshold", "0", "-1", "-2", "--out", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert run.returncode == 2
    assert "--threshold: give one, or one per --layout (2), not 3" in run.stderr
