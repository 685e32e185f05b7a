"""A job killed halfway (SIGKILL: no cleanup runs) leaves no output that looks complete.

kvzap.atomic writes to a temporary file beside the output and renames it into place only when the write
finished; Snakemake additionally marks a running job's outputs incomplete until the job returns.
"""

import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]

# Writes half its payload through kvzap.atomic, announces it, then hangs until killed.
WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from kvzap.atomic import atomic_path
    target, ready = Path(sys.argv[1]), Path(sys.argv[2])
    with atomic_path(target) as tmp:
        with open(tmp, "w") as f:
            f.write('{"half": ')
            f.flush()
            ready.write_text("writing")
            time.sleep(600)
            f.write('"done"}')
""")


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert proc.poll() is None, f"process exited early ({proc.returncode})"
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def kill_writer(tmp_path: Path, target: Path) -> None:
    ready = tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-c", WRITER, str(target), str(ready)])
    try:
        wait_for(ready, proc)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def test_killed_write_leaves_no_output(tmp_path):
    target = tmp_path / "out" / "metrics.json"
    kill_writer(tmp_path, target)
    assert not target.exists()
    # the partial bytes exist only under a hidden temporary name no rule declares as output
    leftovers = list(target.parent.iterdir())
    assert [p.name.startswith(".metrics.json.") and p.name.endswith(".tmp") for p in leftovers] == [True]
    assert leftovers[0].read_text() == '{"half": '


def test_killed_rewrite_keeps_the_previous_complete_output(tmp_path):
    target = tmp_path / "metrics.json"
    target.write_text('{"previous": "complete"}')
    kill_writer(tmp_path, target)
    assert target.read_text() == '{"previous": "complete"}'


def test_snakemake_reruns_a_job_killed_halfway(tmp_path):
    """Kill the whole Snakemake run mid-job: the next dry run must still schedule that job."""
    (tmp_path / "writer.py").write_text(WRITER)
    (tmp_path / "Snakefile").write_text(
        textwrap.dedent(f"""
        rule write:
            output: "results/metrics.json"
            shell: "{sys.executable} writer.py {{output}} ready"
    """)
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    run = subprocess.Popen(
        [*SNAKEMAKE, "--cores", "1"],
        cwd=tmp_path,
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(tmp_path / "ready", run)
    finally:
        os.killpg(run.pid, signal.SIGKILL)  # snakemake and its job: no handler gets to clean up
        run.wait()
    assert not (tmp_path / "results" / "metrics.json").exists()
    dry = subprocess.run(
        [*SNAKEMAKE, "-n", "--cores", "1", "--rerun-incomplete"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert dry.returncode == 0, dry.stderr
    assert "rule write:" in dry.stdout + dry.stderr


@pytest.mark.parametrize("umask", [0o022, 0o002])
def test_outputs_are_created_with_the_users_umask(tmp_path, umask):
    """A group-shared project directory must stay readable: 0666 & ~umask, as open() would create."""
    import torch
    from safetensors.torch import save_file

    from kvzap.atomic import atomic_path, atomic_write_json

    previous = os.umask(umask)
    try:
        atomic_write_json(tmp_path / "metrics.json", {"a": 1})
        with atomic_path(tmp_path / "weights.safetensors") as tmp:
            save_file({"w": torch.zeros(2)}, str(tmp))
    finally:
        os.umask(previous)
    for name in ("metrics.json", "weights.safetensors"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~umask, name
