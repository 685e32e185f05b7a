"""A Refusal is an ordinary exception to library callers and a one-line exit message from a stage's main."""

import subprocess
import sys

import pytest

from kvzap.refusal import Refusal, entry_point


def test_an_entry_point_turns_a_refusal_into_its_message_and_lets_other_errors_through():
    @entry_point
    def main(flag):
        if flag == "bad":
            raise Refusal("--flag bad: use good")
        if flag == "bug":
            raise KeyError("a bug keeps its traceback")
        return flag

    assert main("good") == "good"
    with pytest.raises(SystemExit) as stop:
        main("bad")
    assert stop.value.code == "--flag bad: use good"
    with pytest.raises(KeyError):
        main("bug")


def test_a_stage_run_before_its_inputs_exist_says_which_stage_is_missing(tmp_path):
    """Through the real command line: the refusal comes from a helper below main (fit.load_manifest); the user reads
    one line naming the missing file, no traceback, and no output folder is left behind."""
    out = tmp_path / "surrogate"
    run = subprocess.run(
        [sys.executable, "-m", "kvzap.training.fit", "--kind", "linear", "--alpha", "1", "--seed", "0"]
        + ["--data", str(tmp_path / "oracle"), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 1
    manifest = tmp_path / "oracle" / "train" / "manifest.json"
    assert (
        run.stderr.strip() == f"{manifest} is missing: the oracle collection for {manifest.parent} has not completed."
    )
    assert not out.exists()
