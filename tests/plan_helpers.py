"""The CI config and the Snakefile's parse-time steps, for tests that need a config the plan has accepted: one
copy, so every test plans a config the way the workflow does."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from kvzap.plan import overlays

ROOT = Path(__file__).resolve().parents[1]
BASE = yaml.safe_load((ROOT / "config" / "ci.yaml").read_text())


def planned(config: dict) -> dict:
    """Validate, fill defaults and check, exactly as the Snakefile does (on a copy)."""
    return overlays.checked(copy.deepcopy(config))


OVERLAYS = {  # overlay: the files under it, base first
    "rehearsal.yaml": ["paper.yaml"],
    "paper_small_recipes.yaml": ["paper_small.yaml"],
    "paper_small_2k.yaml": ["paper_small.yaml", "paper_small_recipes.yaml"],
}


def config_files(name: str) -> list[Path]:
    """The files a run of the shipped config `name` passes to --configfile: those under it first, if it is an
    overlay."""
    return [ROOT / "config" / base for base in OVERLAYS.get(name, [])] + [ROOT / "config" / name]
