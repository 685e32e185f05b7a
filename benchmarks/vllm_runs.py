"""What the vLLM benchmarks share: the demo's prompts as kvpress's pipeline feeds them, one engine run in .venv-vllm
(benchmarks/vllm_engine.py, `make setup-vllm`), and the answers cut where generate would stop."""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from contextlib import contextmanager
from pathlib import Path

from transformers import pipeline

from kvzap.evaluation.shared_prefill import pipeline_prompt
from records import output_folder

ROOT = Path(__file__).resolve().parents[1]


def demo_prompts(model, tokenizer, rows) -> list[list[int]]:
    """Each row's token ids as kvpress's pipeline feeds them: context ids, then question + suffix + answer prefix."""
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device=model.device)
    prompts = []
    for row in rows.itertuples():
        context, question = pipeline_prompt(pipe, row, model.device)
        prompts.append(context[0].tolist() + question)
    return prompts


def answers(model, tokenizer, tokens: list[list[int]]) -> list[str]:
    """The engine ran a fixed length past the end token (ignore_eos): cut each answer where generate would stop."""
    end = model.generation_config.eos_token_id
    end = {end} if isinstance(end, int) else set(end or [])
    texts = []
    for ids in tokens:
        stop = next((i for i, t in enumerate(ids) if t in end), len(ids))
        texts.append(tokenizer.decode(ids[:stop], skip_special_tokens=True))
    return texts


def add_engine_folder_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--engine-folder",
        type=output_folder,
        help="keep each engine's record here; a rerun with the same settings reads them back (default: temporary)",
    )


@contextmanager
def engine_folder(kept: Path | None):
    if kept is not None:
        kept.mkdir(parents=True, exist_ok=True)
        yield kept
        return
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


def run_engine(folder: Path, name: str, model: str, prompts: list, engine: dict, max_tokens: int) -> dict:
    """One engine's record, kept in `folder` as `name`.json with what it was run on: a later call with the same
    prompts, engine and length reads it back instead of serving again (a crash after the engines costs nothing)."""
    out = folder / f"{name}.json"
    inputs = {"model": model, "prompts": prompts, "engine": engine, "max_tokens": max_tokens}
    if out.exists() and (kept := json.loads(out.read_text())).get("inputs") == inputs:
        return kept
    (folder / f"{name}.prompts.json").write_text(json.dumps(prompts))
    command = [str(ROOT / ".venv-vllm" / "bin" / "python"), str(ROOT / "benchmarks" / "vllm_engine.py")]
    command += ["--model", model, "--prompts", str(folder / f"{name}.prompts.json"), "--max-tokens", str(max_tokens)]
    command += ["--engine", json.dumps(engine), "--out", str(out)]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"the {name} engine failed:\n{result.stderr[-4000:]}")
    record = json.loads(out.read_text()) | {"inputs": inputs}
    out.write_text(json.dumps(record))
    return record
