"""What the vLLM engine tests share (tests/test_vllm_plugin.py, tests/test_vllm_serve.py): the vLLM environment,
the demo model served with a random surrogate, and the transformers references an engine's tokens are held to."""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kvzap.introspection import attention_modules
from kvzap.prepare import models
from kvzap.pruning import KVzapLayerFillPress, KVzapPress
from kvzap.surrogate.model import Surrogate
from tiny_models import TEXT

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from vllm_serving import greedy  # noqa: E402

VLLM_PYTHON = ROOT / ".venv-vllm" / "bin" / "python"

needs_vllm = pytest.mark.skipif(
    not (ROOT / ".venv-vllm" / ".installed").exists(),
    reason="the vLLM environment is not installed: `make setup-vllm` builds it (Linux, vLLM's CPU wheels)",
)


def demo_served(tmp_path_factory) -> SimpleNamespace:
    """The demo model's Hugging Face folder, its tokenizer, a random MLP surrogate for it, and two prompts."""
    folder = tmp_path_factory.mktemp("vllm")
    record = models.prepare("offline/SmolLM2-135M-Instruct", folder / "model")
    model, tokenizer = models.load(folder / "model" / "model.json", dtype="float32")
    torch.manual_seed(0)
    config = model.config
    surrogate = Surrogate(config.hidden_size, config.num_key_value_heads, config.num_hidden_layers, hidden_dim=72)
    surrogate.save_pretrained(folder / "surrogate")
    prompts = [tokenizer(TEXT).input_ids, tokenizer("Paul Graham wrote essays about").input_ids]
    return SimpleNamespace(
        folder=folder, hf=record["path"], model=model, surrogate=surrogate, prompts=prompts, tokenizer=tokenizer
    )


def attention_inputs(model, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """layer -> (tokens, D): each attention module's input in a transformers forward of one row."""
    inputs = {}
    hooks = [
        module.register_forward_pre_hook(
            lambda m, args, kwargs, i=i: inputs.__setitem__(i, kwargs["hidden_states"][0]), with_kwargs=True
        )
        for i, module in enumerate(attention_modules(model))
    ]
    with torch.no_grad():
        model(ids)
    for hook in hooks:
        hook.remove()
    return inputs


def score_quantile(served, q: float) -> float:
    """A threshold at which every head keeps about 1 - q of the first prompt's tokens."""
    hidden = attention_inputs(served.model, torch.tensor([served.prompts[0]]))
    with torch.no_grad():
        scores = torch.cat([served.surrogate.score_layer(i, h[None]).flatten() for i, h in hidden.items()])
    return scores.quantile(q).item()


def press_generate(
    served, prompt: list[int], tau: float, new_tokens: int, press_class: type = KVzapLayerFillPress
) -> tuple[list[int], KVzapPress]:
    """The transformers path under the plugin's fill policy (or, with press_class=KVzapPress, KVzap's own per-head
    verdicts, as the per-head layout prunes): greedy tokens, and the press that pruned them."""
    press = press_class(str(served.folder / "surrogate"), threshold=tau, decoding=True)
    with torch.no_grad(), press(served.model):
        # no stop and no ban: the end token is one more token, as under vLLM's ignore_eos
        out = served.model.generate(
            torch.tensor([prompt]), max_new_tokens=new_tokens, eos_token_id=None, do_sample=False
        )
    return out[0, len(prompt) :].tolist(), press


def press_generate_in_steps(
    served, prompt: list[int], tau: float, steps: list[int]
) -> tuple[list[int], KVzapLayerFillPress]:
    """The transformers path fed as an engine scheduled it (benchmarks/vllm_serving.greedy): the prompt in the given
    chunks, each one forward the press judges, then one token a forward. Returns the tokens and the press."""
    press = KVzapLayerFillPress(str(served.folder / "surrogate"), threshold=tau, decoding=True)
    return greedy(served.model, prompt, None, press, steps)[0], press
