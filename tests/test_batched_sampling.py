"""AIME's rollouts generated in left-padded batches (`evaluation.batch_size`): greedy answers and per-row ratios
equal batch-1 runs, also for rows that end early while their batch goes on; sampled cells repeat for a seed; kvpress's
presses keep batch size 1."""

import pandas as pd
import pytest
import torch
from kvpress import KnormPress

from kvzap.evaluation.job import _prompt_ids, batches_rows, run_sampling
from kvzap.pruning import KVzapPress
from kvzap.pruning.scorer_presses import SurrogateScorerPress
from kvzap.surrogate.model import Surrogate
from tiny_models import TEXT, tiny_model, tiny_tokenizer

GREEDY = dict(do_sample=False, temperature=None, top_p=None, top_k=None, enable_thinking=False, n_rollouts=2)
SAMPLED = dict(do_sample=True, temperature=0.6, top_p=0.95, top_k=20, enable_thinking=False, n_rollouts=2)


def _press():
    torch.manual_seed(1)
    return KVzapPress(SurrogateScorerPress(surrogate=Surrogate(64, 2, 2)), threshold=0.0, window=16, decoding=True)


@pytest.fixture(scope="module")
def setup():
    tokenizer = tiny_tokenizer()
    model = tiny_model("llama", vocab_size=len(tokenizer))
    words = TEXT.split()
    rows = pd.DataFrame(
        {
            "sample_id": [f"p{i}" for i in range(3)],
            "context": [" ".join(words[i * 7 : i * 7 + n]) for i, n in enumerate((40, 12, 25))],
            "question": [" What is it?", " Say it.", " Answer:"],
            "max_new_tokens": [14, 14, 9],
        }
    )
    return model, tokenizer, rows


@pytest.mark.parametrize("press", [None, "kvzap"])
def test_batched_greedy_rollouts_equal_batch_one(setup, press):
    model, tokenizer, rows = setup
    make = (lambda: None) if press is None else _press
    first = run_sampling(model, tokenizer, rows, make(), GREEDY, seed=0, batch_size=1)
    # a token that row 0 generates early ends it from now on: it stops alone, its batch goes on
    prompt = torch.tensor([_prompt_ids(tokenizer, next(rows.itertuples()), GREEDY)])
    eos = model.generate(prompt, max_new_tokens=3, do_sample=False, pad_token_id=3)[0, -1].item()
    saved = model.generation_config.eos_token_id
    model.generation_config.eos_token_id = eos
    try:
        alone = run_sampling(model, tokenizer, rows, make(), GREEDY, seed=0, batch_size=1)
        batched = run_sampling(model, tokenizer, rows, make(), GREEDY, seed=0, batch_size=4)
    finally:
        model.generation_config.eos_token_id = saved
    assert len(alone["prediction"][0]) < len(first["prediction"][0])  # row 0 did end early
    assert alone["prediction"].tolist() == batched["prediction"].tolist()
    assert alone[["sample_id", "rollout", "prompt_tokens"]].equals(batched[["sample_id", "rollout", "prompt_tokens"]])
    assert torch.allclose(
        torch.tensor(alone["compression_ratio"]), torch.tensor(batched["compression_ratio"]), atol=1e-12
    )
    if press:
        assert (batched["compression_ratio"] > 0.1).all()


def test_sampled_batches_repeat_for_a_seed(setup):
    model, tokenizer, rows = setup
    runs = [run_sampling(model, tokenizer, rows, _press(), SAMPLED, seed=3, batch_size=4) for _ in range(2)]
    assert runs[0].equals(runs[1]) and len(runs[0]) == 6


def test_only_our_presses_and_the_full_cache_batch(setup):
    assert batches_rows(None) and batches_rows(_press()) and not batches_rows(KnormPress(0.5))
    model, tokenizer, rows = setup  # a kvpress press samples one rollout at a time and reports its set ratio
    out = run_sampling(model, tokenizer, rows, KnormPress(0.5), GREEDY, seed=0, batch_size=4)
    assert len(out) == 6 and out["compression_ratio"].tolist() == [0.5] * 6


def test_a_base_model_samples_from_its_plain_prompt(setup):
    """No chat template (Gemma-3-270M): the plain text, with whatever the tokenizer adds, as kvpress's pipeline."""
    model, _, rows = setup
    tokenizer = tiny_tokenizer()
    tokenizer.chat_template = None
    row = next(rows.itertuples())
    assert _prompt_ids(tokenizer, row, GREEDY) == tokenizer((row.context + row.question).strip() + "\n")["input_ids"]
    out = run_sampling(model, tokenizer, rows, None, GREEDY, seed=0, batch_size=2)
    assert len(out) == len(rows) * GREEDY["n_rollouts"]
