"""benchmarks/group_row.py run small on a tiny model: every stage of a group's rows timed, and they add up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from kvzap.surrogate.model import Surrogate
from tiny_models import tiny_model, tiny_tokenizer

ROOT = Path(__file__).resolve().parents[1]


def test_group_row_times_every_stage(tmp_path):
    tok = tiny_tokenizer()
    model = tiny_model("llama", len(tok), max_position_embeddings=2048)
    model.save_pretrained(tmp_path / "hf")
    tok.save_pretrained(tmp_path / "hf")
    (tmp_path / "model.json").write_text(json.dumps({"model_id": "tiny", "path": str(tmp_path / "hf")}))
    torch.manual_seed(0)
    config = model.config
    surrogate = Surrogate(config.hidden_size, config.num_key_value_heads, config.num_hidden_layers)
    surrogate.save_pretrained(tmp_path / "surrogates" / "linear")
    out = tmp_path / "row.json"
    cells = ["full", "kvzap_linear=-0.5", "kvzap_linear=0.5", "knorm=0.5", "streaming_llm=0.75"]
    command = [sys.executable, str(ROOT / "benchmarks" / "group_row.py"), "--model", str(tmp_path / "model.json")]
    command += ["--surrogates", str(tmp_path / "surrogates"), "--cells", *cells, "--context", "300"]
    command += ["--tasks", "niah_single_2", "--n-samples", "2", "--max-new-tokens", "4", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    subprocess.run(command, check=True, env=env, capture_output=True, text=True)
    record = json.loads(out.read_text())
    assert record["rows"] == 2 and record["cells"] == cells and len(record["per_row"]) == 2
    assert all(row[stage] > 0 for row in record["per_row"] for stage in ("prefill_s", "kept_s", "cache_s", "decode_s"))
    stages = sum(record[s] for s in ("prefill_s", "kept_s", "cache_s", "decode_s"))
    assert abs(record["row_s"] - stages) < 0.01  # the stages' means add up to the row
