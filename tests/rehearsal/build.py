"""Write the rehearsal's offline Hub: tiny models with the paper models' architectures and real tokenizers, their
Q-Filters and DuoAttention assets, and a few rows of every dataset the paper config reads, all under the real ids.

    python -m tests.rehearsal.build --cache <folder>
    HF_HUB_CACHE=<folder> HF_HUB_OFFLINE=1 snakemake --configfile config/rehearsal.yaml ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tests.rehearsal import hub_datasets, hub_models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, required=True, help="the Hub cache folder to fill (HF_HUB_CACHE)")
    args = parser.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    hub_models.build(args.cache)
    hub_datasets.build(args.cache)
    print(f"offline Hub written to {args.cache}")


if __name__ == "__main__":
    main()
