"""The conda environments in envs/ must parse and describe the package's own dependency set.

Cluster users select envs/*.yaml through Snakemake's conda integration; if an env drifted from
pyproject.toml, jobs there would run with other versions than the ones the tests ran with.
"""

from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
ENV_FILES = sorted((ROOT / "envs").glob("*.yaml"))


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def by_name(specs: list[str]) -> dict[str, Requirement]:
    """Requirements keyed by canonical name; a name listed twice is an error, not a silent overwrite."""
    reqs = [Requirement(s) for s in specs]
    names = [canonicalize_name(r.name) for r in reqs]
    assert len(names) == len(set(names)), f"duplicate packages in {specs}"
    return dict(zip(names, reqs))


def split_env(env: dict) -> tuple[dict[str, str], list[str]]:
    """(conda packages name -> version spec, pip requirement strings) of a conda env file."""
    conda, pip = {}, []
    for dep in env["dependencies"]:
        if isinstance(dep, dict):
            assert set(dep) == {"pip"}, f"unexpected dependency block {dep}"
            pip.extend(dep["pip"])
        else:
            name, _, version = dep.partition("=")
            conda[name.strip()] = version.lstrip("=")
    return conda, pip


def test_there_is_an_env():
    assert ENV_FILES, "envs/ holds no conda environment"


@pytest.mark.parametrize("path", ENV_FILES, ids=lambda p: p.name)
def test_env_parses_as_a_conda_environment(path):
    env = yaml.safe_load(path.read_text())
    assert isinstance(env, dict) and env.get("name")
    assert env.get("channels") and "defaults" not in env["channels"]
    assert isinstance(env.get("dependencies"), list) and env["dependencies"]
    conda, pip = split_env(env)
    assert "pip" in conda, "a pip section needs pip itself in the conda packages"
    for spec in pip:
        Requirement(spec)  # raises on anything pip would not accept


@pytest.mark.parametrize("path", ENV_FILES, ids=lambda p: p.name)
def test_env_agrees_with_pyproject(path):
    conda, pip = split_env(yaml.safe_load(path.read_text()))
    want = by_name(pyproject()["dependencies"] + pyproject()["optional-dependencies"]["workflow"])
    got = by_name(pip)
    assert sorted(got) == sorted(want), f"missing {set(want) - set(got)}, extra {set(got) - set(want)}"
    for name, req in want.items():
        assert got[name].specifier == req.specifier, f"{name}: env {got[name].specifier} vs pyproject {req.specifier}"
        assert got[name].extras == req.extras, name
    python = conda.get("python")
    assert python, "pin the Python version the env is built with"
    assert Version(python) in SpecifierSet(pyproject()["requires-python"])


def test_every_rule_runs_in_the_conda_environment():
    """`--sdm conda` must reach every job: each rule with a command names envs/kvzap.yaml."""
    import re

    for path in sorted((ROOT / "rules").glob("*.smk")):
        for rule in re.split(r"(?m)^(?=\s*rule\b)", path.read_text())[1:]:
            if "shell:" in rule:
                assert re.search(r"conda:\s*\n\s*ENV\b", rule), f"{path.name}: a rule without conda: ENV"
    assert (ROOT / "workflow" / "../envs/kvzap.yaml").resolve() == ROOT / "envs" / "kvzap.yaml"
