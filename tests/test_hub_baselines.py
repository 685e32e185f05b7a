"""Hub-only baselines (Q-Filters, DuoAttention) on the rehearsal models, offline, through the real Hub code path.

The end-to-end test runs in a subprocess: huggingface_hub reads HF_HUB_CACHE and HF_HUB_OFFLINE once, at import.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest

from kvzap.evaluation import duo_patterns, presses

ROOT = Path(__file__).resolve().parents[1]
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"
CONTEXT = "The quick brown fox jumps over the lazy dog while the special magic number 7341982 hides. " * 25
QUESTION = " What is the special magic number?"


def test_duo_pattern_names_follow_hub_renames():
    published = duo_patterns.duo_pattern_name("meta-llama/Meta-Llama-3.1-8B-Instruct")
    assert duo_patterns.duo_pattern_name(LLAMA) == published
    assert duo_patterns.duo_pattern_name(LLAMA).startswith("Meta-Llama-3.1-8B-Instruct/")
    assert duo_patterns.duo_pattern_name("Qwen/Qwen3-8B") is None
    with pytest.raises(ValueError, match="no head pattern for 'Qwen/Qwen3-32B'.*duo_attention_on_the_fly"):
        presses.build("duo_attention", 0.5, {}).load_attention_pattern(_config_only("Qwen/Qwen3-32B", 64, 8))


def test_patterns_are_kvpress_patterns():
    from kvpress.presses.duo_attention_press import PATTERNS_DICT

    assert set(duo_patterns.PATTERNS.values()) == {unquote(folder) for folder in PATTERNS_DICT.values()}
    for name, folder in PATTERNS_DICT.items():
        assert duo_patterns.PATTERNS[name.replace("//", "/")] == unquote(folder)


def test_duo_patterns_imports_neither_torch_nor_kvpress():
    code = "import sys, kvzap.evaluation.duo_patterns; print(sorted({'torch', 'kvpress'} & set(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env=os.environ | {"PYTHONPATH": str(ROOT / "src")},
    ).stdout
    assert out.strip() == "[]"


def test_presses_see_the_hub_id_of_hub_models_only():
    from kvzap.prepare import models

    hub = {"model_id": "Qwen/Qwen3-8B", "path": "/hub/models--Qwen--Qwen3-8B/snapshots/9c92", "revision": "9c92"}
    offline = {"model_id": "offline/SmolLM2-135M-Instruct", "path": "/results/prepare/hf", "revision": "pypi:x"}
    local = {"model_id": "tiny", "path": "/tmp/tiny/hf", "revision": "r0"}
    assert models.press_lookup_name(hub) == "Qwen/Qwen3-8B"
    assert models.press_lookup_name(offline) == "/results/prepare/hf"
    assert models.press_lookup_name(local) == "/tmp/tiny/hf"


def _write_pattern(folder: Path, scores: str) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text('{"sink_size": 3, "recent_size": 5, "attn_type": "duo"}')
    (folder / "full_attention_heads.tsv").write_text(scores)


def test_pattern_read_from_local_mirror(tmp_path, monkeypatch):
    _write_pattern(tmp_path / duo_patterns.duo_pattern_name(LLAMA), "0.25\t1.5\n-0.5\t0.75\n")
    monkeypatch.setenv(duo_patterns.SOURCE_ENV, str(tmp_path))
    sink, recent, scores = duo_patterns.read_pattern(LLAMA)
    assert (sink, recent) == (3, 5)
    np.testing.assert_array_equal(scores, [[0.25, 1.0], [0.0, 0.75]])  # clipped to [0, 1]
    monkeypatch.setenv(duo_patterns.SOURCE_ENV, str(tmp_path / "elsewhere"))
    with pytest.raises(FileNotFoundError, match="KVZAP_DUO_PATTERNS=.*laid out like"):
        duo_patterns.read_pattern(LLAMA)


def test_pattern_downloaded_from_kvpress_url(monkeypatch):
    """Unset, the files come from the URLs kvpress downloads for Meta-Llama-3.1."""
    import requests
    from kvpress.presses.duo_attention_press import PATTERNS_DICT

    kvpress_url = (
        "https://raw.githubusercontent.com/mit-han-lab/duo-attention/refs/heads/main/attn_patterns/"
        + PATTERNS_DICT["meta-llama/Meta-Llama-3.1-8B-Instruct"]
        + "/"
    )
    served = {
        kvpress_url + "config.json": '{"sink_size": 64, "recent_size": 256}',
        kvpress_url + "full_attention_heads.tsv": "0.5\t0.1\n0.9\t2\n",
    }

    class Response:
        def __init__(self, url):
            self.status_code, self.text = (200, served[unquote(url)]) if unquote(url) in served else (404, "")

    monkeypatch.delenv(duo_patterns.SOURCE_ENV, raising=False)
    monkeypatch.setattr(requests, "get", lambda url, timeout: Response(url))
    sink, recent, scores = duo_patterns.read_pattern(LLAMA)
    assert (sink, recent) == (64, 256)
    np.testing.assert_array_equal(scores, [[0.5, 0.1], [0.9, 1.0]])


def _config_only(model_id: str, layers: int, kv_heads: int):
    from types import SimpleNamespace

    config = SimpleNamespace(
        kvzap_model_id=model_id,
        name_or_path="/somewhere/snapshots/abc",
        num_hidden_layers=layers,
        num_key_value_heads=kv_heads,
    )
    return SimpleNamespace(config=config)


def test_duo_pattern_of_another_model_is_refused(tmp_path, monkeypatch):
    _write_pattern(tmp_path / duo_patterns.duo_pattern_name(LLAMA), "0.25\t0.5\n0.5\t0.75\n")
    monkeypatch.setenv(duo_patterns.SOURCE_ENV, str(tmp_path))
    press = presses.build("duo_attention", 0.5, {})
    assert press.load_attention_pattern(_config_only(LLAMA, 2, 2))[:2] == (3, 5)
    with pytest.raises(ValueError, match=r"shape \(2, 2\).*\(32, 8\)"):
        press.load_attention_pattern(_config_only(LLAMA, 32, 8))


def test_duo_attention_on_the_fly_is_registered():
    method = presses.get("duo_attention_on_the_fly")
    assert (method.parameter, method.needs_hub) == ("ratio", True)
    press = presses.build("duo_attention_on_the_fly", 0.25, {})
    assert press.on_the_fly_scoring and press.head_compression_ratio == 0.25


def _offline_run(workdir: Path) -> dict:
    """prepare -> load -> kvpress pipeline with each Hub-only press, as a real run does it (HF env set by caller)."""
    import kvpress  # noqa: F401  (registers the kv-press-text-generation pipeline)
    from transformers import pipeline

    from kvzap.prepare import models

    answers = {}
    for model_id in ("Qwen/Qwen3-8B", LLAMA, "Qwen/Qwen3-32B"):
        model_json = workdir / model_id.replace("/", "--") / "model.json"
        models.prepare(model_id, model_json.parent)
        model, tokenizer = models.load(model_json)
        pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
        built = {"qfilter": presses.build("qfilter", 0.5, {})}
        if model_id == LLAMA:
            built["duo_attention"] = presses.build("duo_attention", 0.5, {})
        if model_id == "Qwen/Qwen3-8B":
            built["kvzip"] = presses.build("kvzip", 0.5, {})  # loads the tokenizer by name_or_path
        for name, press in built.items():
            answer = pipe(CONTEXT, question=QUESTION, press=press, max_new_tokens=4)["answer"]
            assert isinstance(answer, str)
            assert press.compression_ratio > 0.1, (model_id, name, press.compression_ratio)
            answers[f"{model_id}:{name}"] = answer
        assert (model.config.kvzap_model_id, model.config.name_or_path) == (model_id, model_id)
    return answers


def test_hub_only_baselines_offline(tmp_path):
    from tests.rehearsal import hub_models

    mirror = hub_models.build(tmp_path / "hub")
    env = os.environ | {
        "HF_HUB_CACHE": str(tmp_path / "hub"),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_CACHE": str(tmp_path / "datasets"),
        duo_patterns.SOURCE_ENV: str(mirror),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    result = subprocess.run(
        [sys.executable, __file__, str(tmp_path / "results")], env=env, capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-4000:]
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    assert sorted(answers) == sorted(
        [
            "Qwen/Qwen3-8B:qfilter",
            "Qwen/Qwen3-8B:kvzip",
            f"{LLAMA}:qfilter",
            f"{LLAMA}:duo_attention",
            "Qwen/Qwen3-32B:qfilter",
        ]
    )


if __name__ == "__main__":
    print(json.dumps(_offline_run(Path(sys.argv[1]))))
