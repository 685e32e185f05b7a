"""The long-sample policies on rows: which samples pass the model's positions, and THUDM's middle cut."""

import pandas as pd
import pytest

from kvzap.evaluation import long_samples
from tiny_models import tiny_tokenizer


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _rows(tokenizer, sizes):
    """Rows whose contexts are `sizes` tokens of numbered words, with a short question."""
    contexts = []
    for size in sizes:
        words = " ".join(f"w{i}" for i in range(size))
        ids = tokenizer(words, add_special_tokens=False)["input_ids"][:size]
        contexts.append(tokenizer.decode(ids))
    return pd.DataFrame(
        {
            "sample_id": [f"s{i}" for i in range(len(sizes))],
            "context": contexts,
            "question": "Q?",
            "answer_prefix": " A:",
            "max_new_tokens": 16,
        }
    )


def test_run_keeps_every_token_and_marks_the_long_ones(tokenizer):
    rows = _rows(tokenizer, [100, 900])
    need = long_samples.positions_needed(rows, tokenizer)
    out = long_samples.apply(rows, tokenizer, max_positions=need[1] - 1, policy="run")
    assert out["context"].tolist() == rows["context"].tolist()
    assert out["past_positions"].tolist() == [False, True]
    assert long_samples.summary(out, "run", need[1] - 1) == {
        "policy": "run",
        "max_positions": need[1] - 1,
        "count": 1,
        "sample_ids": ["s1"],
    }


def test_truncate_middle_fits_the_positions_keeping_head_and_tail(tokenizer):
    rows = _rows(tokenizer, [100, 900])
    limit = long_samples.positions_needed(rows, tokenizer)[0] + 200
    out = long_samples.apply(rows, tokenizer, max_positions=limit, policy="truncate_middle")
    assert out["context"][0] == rows["context"][0]  # fits: untouched
    cut, whole = out["context"][1], rows["context"][1]
    assert long_samples.positions_needed(out, tokenizer)[1] <= limit + 2  # decode/encode may merge a token or two
    assert cut[:40] == whole[:40] and cut[-40:] == whole[-40:] and len(cut) < len(whole)
    assert out["past_positions"].tolist() == [False, True]  # recorded as it was


def test_unknown_policy_is_named(tokenizer):
    with pytest.raises(ValueError, match="truncate_middle"):
        long_samples.apply(_rows(tokenizer, [10]), tokenizer, 100, "truncate_start")
