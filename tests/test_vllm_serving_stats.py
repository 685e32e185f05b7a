"""The serving benchmark's per-request latencies from an engine's per-step record, with vLLM 0.32's request ids
("<prompt index>-<random suffix>"), computed by hand."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import vllm_serving  # noqa: E402


def test_latencies_map_suffixed_request_ids_to_their_prompts():
    record = {
        "tokens": [[1, 2, 3], [4, 5]],
        "seconds": 3.0,
        "steps": [
            {"seconds": 0.0, "outputs": {"0-a6ba2430": 0, "1-0f3c9e11": 0}},
            {"seconds": 1.0, "outputs": {"0-a6ba2430": 1, "1-0f3c9e11": 1}},
            {"seconds": 2.0, "outputs": {"0-a6ba2430": 2, "1-0f3c9e11": 2}},
        ],
    }
    # both first output at 1.0; prompt 0: 3 tokens by 3.0 -> (3 - 1) / 2 = 1.0 s each; prompt 1: 2 tokens -> 2.0 s
    assert vllm_serving.latencies(record) == pytest.approx(
        {"ttft_p50_s": 1.0, "ttft_p95_s": 1.0, "tpot_p50_s": 1.0, "tpot_p95_s": 2.0}
    )
    assert [vllm_serving.prompt_index(r) for r in record["steps"][0]["outputs"]] == [0, 1]


def test_the_transformers_reference_attends_pad_tokens_inside_the_prompt():
    """A chat-templated prompt holds the end-of-turn token, which is the demo model's pad token: the reference
    greedy tokens attend it, as vLLM does (an argmax loop over the full prompt)."""
    from tiny_models import tiny_model

    model = tiny_model("llama")
    model.generation_config.pad_token_id = model.generation_config.eos_token_id = 2
    prompt = [5, 9, 2, 17, 30, 2, 44, 12]
    tokens, _ = vllm_serving.greedy(model, prompt, 4, None)
    ids = list(prompt)
    for _ in range(4):
        ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert tokens == ids[len(prompt) :]
