"""Tiny stand-ins for config/paper.yaml's models, written into a fake Hub cache under their real repo ids.

Each model keeps its real architecture (Qwen3 q/k-norm, GQA ratio, rope settings, vocab size) and its real tokenizer,
scaled down to 2 layers and random bf16 weights (and Qwen3's 40,960 positions to 4,096, so that the LongBench
NarrativeQA fixture passes them as the real NarrativeQA passes Qwen3's; Llama-3.1 keeps its 131,072), and ships the
files its Hub repo ships (config.json in the Hub's format, generation_config.json, model.safetensors, tokenizer
files). Around them: the Q-Filters repos QFilterPress downloads (nthngdy/<name>_qfilt) and a mirror of DuoAttention's
attn_patterns/ folder for Llama-3.1 (read through KVZAP_DUO_PATTERNS, see kvzap.evaluation.duo_patterns).
Deterministic (seeded weights, content-addressed commits); about 15 s of CPU to build.

Not written: kmfoda/booksum for duo_attention_on_the_fly. With HF_HUB_OFFLINE=1, datasets 5.2 refuses Hub datasets
before looking at the Hub cache ("Couldn't reach 'kmfoda/booksum' on the Hub (OfflineModeIsEnabled)") and falls
back only to its own processed cache (HF_DATASETS_CACHE), so a Hub-cache fixture would never be read.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save as safetensors_bytes
from tests.rehearsal.hub_cache import write_repo
from transformers import AutoConfig, AutoModelForCausalLM

from kvzap.evaluation.duo_patterns import duo_pattern_name

TOKENIZERS = Path(__file__).resolve().parents[2] / ".cache" / "tokenizers"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
SEED = 0
QWEN3_POSITIONS = 4096  # Qwen3's 40,960 scaled down with the fixtures (tests/rehearsal/hub_datasets.py)

_QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 128,
    "hidden_act": "silu",
    "hidden_size": 128,
    "initializer_range": 0.02,
    "max_position_embeddings": QWEN3_POSITIONS,
    "max_window_layers": 2,
    "num_hidden_layers": 2,
    "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0",
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
_QWEN3_GENERATION = {
    "bos_token_id": 151643,
    "do_sample": True,
    "eos_token_id": [151645, 151643],
    "pad_token_id": 151643,
    "temperature": 0.6,
    "top_k": 20,
    "top_p": 0.95,
    "transformers_version": "4.51.0",
}

# repo id -> (config.json, generation_config.json, tokenizer folder). Real values (head_dim 128 included: RoPE's
# slow frequencies are what keep long-context queries in a half-space) except the sizes, which keep each model's
# GQA ratio: Qwen3-8B 32:8 heads, Qwen3-32B 64:8, Llama-3.1 32:8.
MODELS = {
    "Qwen/Qwen3-8B": ({**_QWEN3, "intermediate_size": 384, "num_attention_heads": 8}, _QWEN3_GENERATION, "qwen3"),
    "Qwen/Qwen3-32B": ({**_QWEN3, "intermediate_size": 640, "num_attention_heads": 16}, _QWEN3_GENERATION, "qwen3"),
    "meta-llama/Llama-3.1-8B-Instruct": (
        {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": 128000,
            "eos_token_id": [128001, 128008, 128009],
            "head_dim": 128,
            "hidden_act": "silu",
            "hidden_size": 128,
            "initializer_range": 0.02,
            "intermediate_size": 448,
            "max_position_embeddings": 131072,
            "mlp_bias": False,
            "num_attention_heads": 8,
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {
                "factor": 8.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.43.0.dev0",
            "use_cache": True,
            "vocab_size": 128256,
        },
        {
            "bos_token_id": 128000,
            "do_sample": True,
            "eos_token_id": [128001, 128008, 128009],
            "temperature": 0.6,
            "top_p": 0.9,
            "transformers_version": "4.42.3",
        },
        "llama3_1",
    ),
}
SHARED_DIRECTION_NORM = 0.5  # about twice the norm of a random embedding row (std 0.02, 128 dims)
DUO_SINK_SIZE, DUO_RECENT_SIZE = 64, 256  # the published patterns' config.json values


def _json(data: dict) -> bytes:
    return (json.dumps(data, indent=2) + "\n").encode()


def _weights(config: dict, seed: int) -> bytes:
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config))
    # Trained LLMs' hidden states share a dominant direction, so each head's queries lie in a half-space; kvpress's
    # head-wise masking (attention_patch.search_hyperplane: KVzip, AdaKV, DuoAttention) relies on it. Random
    # embeddings have no such direction: give every row the same offset.
    with torch.no_grad():
        embeddings = model.get_input_embeddings().weight
        embeddings += SHARED_DIRECTION_NORM * torch.nn.functional.normalize(torch.randn(embeddings.shape[1]), dim=0)
    tensors = {name: tensor.to(torch.bfloat16).contiguous() for name, tensor in model.state_dict().items()}
    return safetensors_bytes(tensors, metadata={"format": "pt"})


def _kv_shape(config: dict) -> tuple[int, int, int]:
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    return config["num_hidden_layers"], config["num_key_value_heads"], head_dim


def _qfilter_files(config: dict, seed: int) -> dict[str, bytes]:
    """The repo QFilters.save_pretrained writes (config.json + model.safetensors), as QFilterPress reads it."""
    from kvpress.presses.qfilter_press import QFilters

    torch.manual_seed(seed)
    filters = QFilters(*_kv_shape(config))
    with tempfile.TemporaryDirectory() as folder:
        filters.save_pretrained(folder)
        return {path.name: path.read_bytes() for path in Path(folder).iterdir() if path.is_file()}


def _write_duo_pattern(mirror: Path, folder: str, config: dict, seed: int) -> None:
    """config.json and full_attention_heads.tsv (layers x KV heads, tab-separated) as attn_patterns/ holds them."""
    layers, kv_heads, _ = _kv_shape(config)
    scores = np.random.default_rng(seed).uniform(0, 1, size=(layers, kv_heads))
    target = mirror / folder
    target.mkdir(parents=True, exist_ok=True)
    (target / "config.json").write_bytes(_json({"sink_size": DUO_SINK_SIZE, "recent_size": DUO_RECENT_SIZE}))
    np.savetxt(target / "full_attention_heads.tsv", scores, delimiter="\t")


def build(cache: Path, duo_mirror: Path | None = None) -> Path:
    """Write every model and Q-Filters repo into `cache`, and the DuoAttention mirror; returns the mirror folder."""
    cache = Path(cache)
    duo_mirror = Path(duo_mirror) if duo_mirror else cache / "duo-attention-patterns"
    for seed, (repo_id, (config, generation, tokenizer)) in enumerate(MODELS.items(), start=SEED):
        files = {
            "config.json": _json(config),
            "generation_config.json": _json(generation),
            "model.safetensors": _weights(config, seed),
        }
        files |= {name: TOKENIZERS / tokenizer / name for name in TOKENIZER_FILES}
        write_repo(cache, repo_id, files)
        write_repo(cache, f"nthngdy/{repo_id.split('/')[-1]}_qfilt", _qfilter_files(config, seed))
        if folder := duo_pattern_name(repo_id):
            _write_duo_pattern(duo_mirror, folder, config, seed)
    return duo_mirror
