"""The calibration stage: `python -m kvzap.training.calibrate` writes the thresholds of target ratios for one model and
surrogate on a list of texts, or on offline RULER-style prompts of another seed than the evaluation's (`--ruler`), so
that a threshold is chosen on text like the benchmark's without reading its rows (kvzap.pruning.calibration does the
work; this checks the arguments and files)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kvzap.atomic import atomic_write_json
from kvzap.evaluation.suites.catalog import RULER_OFFLINE_TASKS
from kvzap.prepare.models import load
from kvzap.pruning.calibration import calibrate, collect_scores
from kvzap.pruning.scorer_presses import SurrogateScorerPress
from kvzap.refusal import Refusal, entry_point
from kvzap.surrogate.model import Surrogate
from kvzap.window import WINDOW


def read_texts(path: Path) -> list[str]:
    """The --texts file: a non-empty JSON list of non-empty strings, checked before the model loads."""
    try:
        texts = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise Refusal(
            f"--texts {path}: not a readable JSON text file ({err}). Fix: pass a JSON list of texts."
        ) from None
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t.strip() for t in texts):
        raise Refusal(f'--texts {path}: a non-empty JSON list of non-empty strings is needed, e.g. ["text", ...].')
    return texts


def check_args(args) -> None:
    """Everything that can be checked without the model, so a bad argument stops before any forward."""
    for target in args.targets:
        if not 0 <= target < 1:
            raise Refusal(f"--targets {target}: a target is a fraction removed in [0, 1), e.g. 0.5 0.67 0.75.")
    if args.ruler is not None and args.ruler < 64:
        raise Refusal(f"--ruler {args.ruler}: a RULER-style prompt needs 64 tokens or more, e.g. --ruler 4096.")
    if args.window < 0 or args.max_tokens < 1:
        raise Refusal(f"--window {args.window} --max-tokens {args.max_tokens}: need window >= 0, max-tokens >= 1.")
    try:
        record = json.loads(Path(args.model_json).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise Refusal(
            f"--model-json {args.model_json}: not readable JSON ({err}). Fix: run the prepare stage."
        ) from None
    if not isinstance(record, dict) or not isinstance(record.get("path"), str):
        raise Refusal(f"--model-json {args.model_json}: not a model.json (no path). Fix: run the prepare stage.")
    if args.out.is_dir():
        raise Refusal(f"--out {args.out} is a folder: name the JSON file to write, e.g. {args.out / 'tau.json'}.")


def ruler_texts(tokenizer, context_tokens: int, tasks: list[str], seed: int) -> list[str]:
    """One offline RULER-style prompt per task, as the model's chat template gives it (the evaluation's prompt)."""
    from kvzap.evaluation.suites import ruler  # the generator's essays load only when asked for

    rows = ruler.generate(tokenizer, tasks, context_tokens, 1, seed=seed)
    chats = [[{"role": "user", "content": (row.context + row.question).strip()}] for row in rows.itertuples()]
    return [tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False) for chat in chats]


@entry_point
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Thresholds of target compression ratios.")
    parser.add_argument("--model-json", required=True, help="model.json written by `python -m kvzap.prepare.models`")
    parser.add_argument("--surrogate", required=True, help="surrogate folder or Hub id")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--texts", type=Path, help="JSON list of calibration texts")
    source.add_argument("--ruler", type=int, metavar="TOKENS", help="offline RULER-style prompts of this length")
    parser.add_argument("--ruler-tasks", nargs="+", default=list(RULER_OFFLINE_TASKS), choices=RULER_OFFLINE_TASKS)
    parser.add_argument("--ruler-seed", type=int, default=7, help="not the evaluation's (42): other rows")
    parser.add_argument("--targets", type=float, nargs="+", default=[0.5, 0.67, 0.75])
    parser.add_argument("--window", type=int, default=WINDOW)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    check_args(args)
    texts = read_texts(args.texts) if args.texts else None
    try:
        scorer = SurrogateScorerPress(surrogate=Surrogate.from_pretrained(args.surrogate))
    except (OSError, ValueError, TypeError) as err:
        raise SystemExit(f"--surrogate {args.surrogate}: {err}") from None
    model, tokenizer = load(args.model_json)
    texts = texts or ruler_texts(tokenizer, args.ruler, args.ruler_tasks, args.ruler_seed)
    ids = [tokenizer(t, return_tensors="pt").input_ids[:, : args.max_tokens] for t in texts]
    try:
        result = calibrate(collect_scores(model, ids, scorer, args.window), args.targets)
    except ValueError as err:
        raise SystemExit(str(err)) from None
    atomic_write_json(args.out, result)
    for row in result["thresholds"]:
        print(f"target {row['target']:.2f}: threshold {row['threshold']:.4f} -> ratio {row['compression_ratio']:.4f}")


if __name__ == "__main__":
    main()
