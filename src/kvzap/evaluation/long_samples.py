"""Samples that need more positions than the model was trained for, handled one by one, never by failing a job.

LongBench's NarrativeQA averages about 30k tokens and some of its samples pass Qwen3's 40,960 positions. kvpress,
whose evaluation produced the paper's numbers, runs them as they are (its pipeline cuts a context only past the
tokenizer's `model_max_length`, 131,072 for Qwen3 and Llama-3.1, which the pipeline does here too), so the paper's
Qwen3 scores include them: policy `run`, the paper config's. THUDM's LongBench instead cuts the middle of a prompt
that is too long: policy `truncate_middle`, a deviation from the paper's protocol, labelled as such in docs/methods.md.
Either way each sample records whether it was past the model's positions (`past_positions` in predictions.csv), and
the cell's metrics.json the policy and their count and ids, which results.csv shows.
"""

from __future__ import annotations

import pandas as pd

POLICIES = {
    "run": "run as kvpress runs them (the paper's protocol): every token, past the model's trained positions",
    "truncate_middle": "deviation (THUDM LongBench's rule): cut the middle of the context until the sample fits",
}
TEMPLATE_TOKENS = 64  # what a chat template adds around the prompt, at most (a generous estimate)


def n_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def positions_needed(rows: pd.DataFrame, tokenizer) -> list[int]:
    """Per row: context + question + answer prefix + template + the tokens it may generate."""
    return [
        n_tokens(tokenizer, row.context)
        + n_tokens(tokenizer, row.question + row.answer_prefix)
        + TEMPLATE_TOKENS
        + int(row.max_new_tokens)
        for row in rows.itertuples()
    ]


def middle_cut(tokenizer, text: str, keep: int) -> str:
    """`text` without its middle: its first ceil(keep/2) and last floor(keep/2) tokens, decoded back."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    head = (keep + 1) // 2
    tail = ids[len(ids) - (keep - head) :] if keep > head else []
    return tokenizer.decode(ids[:head], skip_special_tokens=True) + tokenizer.decode(tail, skip_special_tokens=True)


def apply(rows: pd.DataFrame, tokenizer, max_positions: int, policy: str) -> pd.DataFrame:
    """The rows to run under `policy`, with a `past_positions` column saying which needed more than the model's."""
    if policy not in POLICIES:
        raise ValueError(f"Unknown long-sample policy {policy!r}: use one of {list(POLICIES)}")
    need = positions_needed(rows, tokenizer)
    rows = rows.assign(past_positions=[n > max_positions for n in need])
    if policy == "truncate_middle":
        contexts = list(rows["context"])
        for i, (row, needed) in enumerate(zip(rows.itertuples(), need)):
            if needed > max_positions:
                keep = max(n_tokens(tokenizer, row.context) - (needed - max_positions), 0)
                contexts[i] = middle_cut(tokenizer, row.context, keep)
        rows = rows.assign(context=contexts)
    return rows


def summary(predictions: pd.DataFrame, policy: str, max_positions: int) -> dict:
    """What metrics.json records: the policy, the positions, and the samples that needed more."""
    past = predictions.loc[predictions["past_positions"].astype(bool), "sample_id"]
    ids = sorted(set(past.astype(str)))
    return {"policy": policy, "max_positions": int(max_positions), "count": len(ids), "sample_ids": ids}
