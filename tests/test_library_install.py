"""`pip install kvzap` alone (no workflow extra) is enough to prune: a clean venv gets the library and its own
dependencies only, imports kvzap.pruning, prunes a tiny model's cache, and has none of the workflow's packages."""

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORKFLOW_ONLY = ["snakemake", "matplotlib", "jieba", "rouge", "gguf", "jsonschema", "tabulate"]

PRUNE = textwrap.dedent(
    """
    import importlib.util, sys, tempfile
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from kvzap.pruning import KVzapPress
    from kvzap.surrogate.model import Surrogate

    present = [name for name in sys.argv[1:] if importlib.util.find_spec(name) is not None]
    assert not present, f"workflow packages installed with the library: {present}"
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=200, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    model = LlamaForCausalLM(config).eval()
    folder = tempfile.mkdtemp()
    Surrogate(64, 2, 2, hidden_dim=8).save_pretrained(folder)
    press = KVzapPress(folder, threshold=0.0, window=16)
    ids = torch.randint(0, 200, (1, 120))
    with torch.no_grad(), press(model):
        out = model.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 124)
    assert 0 < press.compression_ratio < 1, press.compression_ratio
    print("pruned", round(press.compression_ratio, 3))
    """
)


def test_the_library_installs_and_prunes_without_the_workflow(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, "torch==2.13.0"], check=True)  # pinned: the CPU wheel, as the Makefile installs it
    source = tmp_path / "kvzap"  # a copy: building in the checkout would leave build/ behind in it
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("*.egg-info", "__pycache__"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    subprocess.run([*pip, str(source)], check=True)
    done = subprocess.run([python, "-c", PRUNE, *WORKFLOW_ONLY], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("pruned")
