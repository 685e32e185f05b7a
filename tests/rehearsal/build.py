"""Write the rehearsal's offline Hub: tiny models with the paper models' architectures and real tokenizers, their
Q-Filters and DuoAttention assets, and a few rows of every dataset the paper config reads, all under the real ids.

    python -m tests.rehearsal.build --cache <folder>
    HF_HUB_CACHE=<folder> HF_DATASETS_CACHE=<folder>/datasets HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 \
    KVZAP_DUO_PATTERNS=<folder>/duo-attention-patterns \
    snakemake all --configfile config/paper.yaml config/rehearsal.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.rehearsal import hub_datasets, hub_models
from transformers import AutoTokenizer

from kvzap.plan import overlays

ROOT = Path(__file__).resolve().parents[2]
# RULER rows shorter than their folder's name, so that ~60 jobs of 13 prompts each run on 2 CPU cores. 1024 is about
# the shortest the word tasks (cwe, fwe) size to; 2100 goes past KVzip's 2048-token chunks, so its chunked repetition
# runs.
RULER_TOKENS = {4096: 1024, 16384: 2100}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="the Hub cache folder to fill (HF_HUB_CACHE)")
    parser.add_argument(
        "--config",
        type=Path,
        nargs="+",
        default=[ROOT / "config" / "paper.yaml", ROOT / "config" / "rehearsal.yaml"],
        help="the config and its overlays: sizes the Nemotron rows to its oracle token window",
    )
    args = parser.parse_args()
    oracle = overlays.load(args.config)["oracle"]
    args.cache.mkdir(parents=True, exist_ok=True)
    hub_models.build(args.cache)  # the DuoAttention mirror lands in <cache>/duo-attention-patterns
    tokenizer = AutoTokenizer.from_pretrained(ROOT / ".cache" / "tokenizers" / "llama3_1")  # RULER's Hub data used it
    hub_datasets.build(
        args.cache,
        tokenizer,
        min_tokens=oracle["min_tokens"],
        max_tokens=oracle["max_tokens"],
        ruler_tokens=RULER_TOKENS,
        datasets_cache=args.cache / "datasets",
    )
    print(f"offline Hub written to {args.cache}")


if __name__ == "__main__":
    main()
