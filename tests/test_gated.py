"""A gated model (Llama-3.1, as on the Hub) is refused with the fix before any job, and by prepare as one line; a
missing repository or revision is refused too; an unreachable or offline Hub still passes silently, and a cached
config.json needs no network.

The Hub is tests/fake_hub.py on 127.0.0.1, answering a gated repository's files as the Hub does (401 without a
token, 403 with one, X-Error-Code: GatedRepo). huggingface_hub reads HF_ENDPOINT when imported, so every checked
command runs as a child process with that endpoint, empty caches and no token.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import yaml
from tests.rehearsal.hub_cache import write_repo

from fake_hub import FakeHub, client_env
from kvzap.prepare.prefetch import MODEL_FILES, Fetch, refusal
from plan_helpers import BASE, ROOT

GATED = "meta-llama/Llama-3.1-8B-Instruct"
OPEN = "tiny-org/tiny-llama"  # an ungated repository with a config.json
LLAMA_CONFIG = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4}
FIX = ("accept its licence", f"https://huggingface.co/{GATED}", "hf auth login", "HF_TOKEN", "snakemake prefetch")


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    cache = tmp_path_factory.mktemp("served")
    files = {"config.json": json.dumps(LLAMA_CONFIG).encode(), "model.safetensors": b"\0" * 64}
    write_repo(cache, GATED, files)
    write_repo(cache, OPEN, files)
    with FakeHub(cache, gated=(GATED,)) as server:
        yield server


def hub_config(tmp_path, model_id: str, revision: str | None = None):
    """config/ci.yaml with its model replaced by `model_id` (the offline RULER entry and corpus stay)."""
    config = copy.deepcopy(BASE)
    model = {**config["models"].pop("smollm2-135m"), "id": model_id, **({"revision": revision} if revision else {})}
    config["models"] = {"llama": model}
    config["tables"] = {"best": {"llama": config["tables"]["best"]["smollm2-135m"]}}
    config["results"] = "results/gated-test"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def one_line_refusal(result: subprocess.CompletedProcess) -> str:
    """The refusal: a non-zero exit whose last line of stderr says it all (above it at most progress bars), not a
    traceback."""
    assert result.returncode != 0, result.stdout
    assert "Traceback" not in result.stderr and "Error" not in result.stderr, result.stderr
    return result.stderr.strip().splitlines()[-1]


def test_prepare_refuses_a_gated_model_with_the_fix(hub, tmp_path):
    out = tmp_path / "prepared"
    result = run(["-m", "kvzap.prepare.models", "--model-id", GATED, "--out", str(out)], client_env(hub.url, tmp_path))
    message = one_line_refusal(result)
    assert message.startswith(f"{GATED}: a gated model") and "HTTP 401" in message and "sent no token" in message
    assert all(part in message for part in FIX) and "HF_HUB_OFFLINE=1" in message
    assert not (out / "model.json").exists()
    # the Hub was asked for a file of this repository, and answered as for a gated repository
    assert ("HEAD", f"/{GATED}/resolve/{{}}/config.json", 401) in {(m, _generic(p), s) for m, p, s in hub.requests}


def _generic(path: str) -> str:
    """A resolve path with its commit replaced by {} (the commit is content-addressed)."""
    parts = path.split("/")
    return "/".join(parts[:4] + ["{}"] + parts[5:]) if len(parts) > 5 and parts[3] == "resolve" else path


def test_prepare_with_a_token_not_granted_access(hub, tmp_path):
    env = client_env(hub.url, tmp_path, HF_TOKEN="hf_not_granted")
    message = one_line_refusal(run(["-m", "kvzap.prepare.models", "--model-id", GATED, "--out", str(tmp_path)], env))
    assert "gated model" in message and "HTTP 403" in message and "not been granted access" in message
    assert all(part in message for part in FIX)


def test_prefetch_refuses_a_gated_model_with_the_fix(hub, tmp_path):
    fetches = json.dumps([Fetch("snapshot", GATED, patterns=MODEL_FILES).to_json()])
    result = run(["-m", "kvzap.prepare.prefetch", "--fetches", fetches], client_env(hub.url, tmp_path))
    message = one_line_refusal(result)
    assert message.startswith(f"{GATED}: a gated model") and all(part in message for part in FIX)


def test_prepare_offline_without_the_model_says_prefetch(hub, tmp_path):
    env = client_env(hub.url, tmp_path, HF_HUB_OFFLINE="1")
    message = one_line_refusal(run(["-m", "kvzap.prepare.models", "--model-id", OPEN, "--out", str(tmp_path)], env))
    assert message.startswith(f"{OPEN} (revision main) is not in the Hub cache {tmp_path / 'hub'}")
    assert "HF_HUB_OFFLINE=1 is set" in message and "`snakemake prefetch`" in message


def test_plan_refuses_a_gated_model_before_any_job(hub, tmp_path):
    result = run(["-m", "kvzap.plan", str(hub_config(tmp_path, GATED))], client_env(hub.url, tmp_path))
    message = one_line_refusal(result)
    assert message.startswith(
        f"Invalid configuration: models.llama.id = '{GATED}': a gated model on the Hugging Face Hub"
    )
    assert all(part in message for part in FIX) and "HF_HUB_OFFLINE=1" in message


def test_snakemake_refuses_a_gated_model_at_parse(hub, tmp_path):
    env = client_env(hub.url, tmp_path, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    result = subprocess.run(
        ["snakemake", "-n", "--configfile", str(hub_config(tmp_path, GATED))],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode != 0 and "Job stats" not in result.stdout
    assert f"models.llama.id = '{GATED}': a gated model" in result.stderr + result.stdout


@pytest.mark.parametrize(
    "model_id, revision, expected",
    [
        ("nobody/no-such-model", None, "models.llama.id = 'nobody/no-such-model': the Hub has no model repository"),
        (OPEN, "v9", f"models.llama.revision = 'v9': the Hub has no revision 'v9' of {OPEN}"),
    ],
)
def test_plan_refuses_a_missing_repository_or_revision(hub, tmp_path, model_id, revision, expected):
    message = one_line_refusal(
        run(["-m", "kvzap.plan", str(hub_config(tmp_path, model_id, revision))], client_env(hub.url, tmp_path))
    )
    assert expected in message and "Fix: " in message


def test_plan_reads_an_open_model_from_the_hub(hub, tmp_path):
    result = run(["-m", "kvzap.plan", str(hub_config(tmp_path, OPEN))], client_env(hub.url, tmp_path))
    assert result.returncode == 0 and "valid" in result.stdout, result.stderr
    assert (tmp_path / "hub" / f"models--{OPEN.replace('/', '--')}").is_dir()  # config.json was downloaded


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_or_offline_hub_passes_silently(hub, tmp_path):
    config = str(hub_config(tmp_path, GATED))
    unreachable = run(["-m", "kvzap.plan", config], client_env(f"http://127.0.0.1:{_closed_port()}", tmp_path))
    assert unreachable.returncode == 0 and "valid" in unreachable.stdout, unreachable.stderr
    before = len(hub.requests)
    offline = run(["-m", "kvzap.plan", config], client_env(hub.url, tmp_path, HF_HUB_OFFLINE="1"))
    assert offline.returncode == 0 and "valid" in offline.stdout, offline.stderr
    assert len(hub.requests) == before  # offline: not one request


def test_a_cached_config_needs_no_network(hub, tmp_path):
    """Cache first: a config.json in the Hub cache is read even for a gated id, without asking the Hub."""
    write_repo(tmp_path / "hub", GATED, {"config.json": json.dumps(LLAMA_CONFIG).encode()})
    before = len(hub.requests)
    result = run(["-m", "kvzap.plan", str(hub_config(tmp_path, GATED))], client_env(hub.url, tmp_path))
    assert result.returncode == 0 and "valid" in result.stdout, result.stderr
    assert len(hub.requests) == before


def _hub_error(status: int, code: str | None = None, message: str | None = None) -> Exception:
    """The exception huggingface_hub raises for a Hub answer (hf_raise_for_status maps the X-Error-Code)."""
    from huggingface_hub.utils import hf_raise_for_status

    request = httpx.Request("HEAD", "https://huggingface.co/org/name/resolve/main/config.json")
    headers = {k: v for k, v in {"X-Error-Code": code, "X-Error-Message": message}.items() if v}
    try:
        hf_raise_for_status(httpx.Response(status, headers=headers, request=request))
    except Exception as error:  # whichever class it maps to is the point
        return error
    raise AssertionError(f"HTTP {status} raised nothing")


@pytest.mark.parametrize(
    "error, expected",
    [
        (_hub_error(401, "GatedRepo", "Access to model org/name is restricted."), "a gated model"),
        (_hub_error(403, "GatedRepo", "not in the authorized list"), "has not been granted access (HTTP 403)"),
        (_hub_error(403, None, "Forbidden"), "a gated model"),
        (_hub_error(401, None, "Invalid credentials in Authorization header"), "rejected this machine's token"),
        (_hub_error(404, "RevisionNotFound", "Invalid rev id: v9"), "no revision 'v9' of org/name"),
        (_hub_error(401, "RepoNotFound", "Repository not found"), "no model repository org/name"),
        (_hub_error(500, None, "boom"), None),
        (_hub_error(404, "EntryNotFound", "no config.json"), None),
        (httpx.ConnectError("unreachable"), None),
    ],
)
def test_refusal_reasons(error, expected):
    reason = refusal("org/name", error, revision="v9")
    assert (reason is None) if expected is None else (expected in reason[0] and reason[1])


def test_a_gated_dataset_names_its_dataset_page():
    problem, fix = refusal("org/data", _hub_error(401, "GatedRepo", "restricted"), repo_type="dataset")
    assert problem.startswith("a gated dataset") and "https://huggingface.co/datasets/org/data" in fix
