"""Publishing: the dry-run folders load back with kvpress/transformers and datasets, and the upload
path speaks the Hub's HTTP API (create repo, validate card, preupload, commit) with the env token.

The network is replaced at huggingface_hub's HTTP boundary: its global httpx client is swapped for one
with an httpx.MockTransport, so everything above it (HfApi, upload_folder, commit payloads) runs for real.
"""

import base64
import json
from pathlib import Path

import httpx
import huggingface_hub
import pandas as pd
import pytest
import torch
from huggingface_hub import DatasetCard, ModelCard

from kvzap import publish
from kvzap.refusal import Refusal
from kvzap.surrogate.model import Surrogate
from surrogate_folders import BASE, make_surrogate

TOKEN = "hf_test_token_never_written"


@pytest.fixture
def trained(tmp_path):
    surrogates = {kind: make_surrogate(tmp_path / "results" / "qwen3-8b", kind) for kind in ("linear", "mlp")}
    tables = tmp_path / "results" / "tables"
    tables.mkdir(parents=True)
    # as kvzap.report.aggregate writes results.csv: `model` is the config key (the results/<key>/ folder),
    # the sweep value of kvzap_<kind> is tau; other methods sweep ratios
    pd.DataFrame(
        {
            "model": ["qwen3-8b"] * 7 + ["other"],
            "model_id": [BASE] * 7 + ["other/Model"],
            "method": ["kvzap_mlp"] * 4 + ["kvzap_linear"] * 2 + ["kvzap_mlp_head", "kvzap_mlp"],
            "benchmark": ["ruler", "ruler", "longbench", "longbench", "ruler", "ruler", "ruler", "ruler"],
            "value": [-5.0, -3.0, -5.0, -3.0, -5.0, -3.0, 0.5, -5.0],
            "compression_ratio": [0.2, 0.6, 0.4, 0.8, 0.1, 0.5, 0.5, 0.99],
            "score": [90.0, 80.0, 50.0, 45.0, 91.0, 70.0, 60.0, 1.0],
        }
    ).to_csv(tables / "summary.csv", index=False)
    pd.DataFrame({"model": [BASE], "method": ["full"], "score": [92.0]}).to_csv(tables / "baselines.csv", index=False)
    return surrogates, sorted(tables.glob("*.csv"))


def run(out: Path, surrogates: dict, tables: list[Path], *extra: str) -> dict:
    publish.main(
        [
            "--out",
            str(out),
            "--namespace",
            "me",
            "--dataset-repo",
            "me/KVzap-results",
            "--surrogates",
            *(str(folder) for folder, _ in surrogates.values()),
            "--tables",
            *map(str, tables),
            *extra,
        ]
    )
    return json.loads((out / "plan.json").read_text())


def test_dry_run_folders_load_back(trained, tmp_path, monkeypatch):
    from datasets import load_dataset
    from kvpress.presses.kvzap_press import KVzapModel

    monkeypatch.delenv("HF_TOKEN", raising=False)  # a dry run needs no token
    surrogates, tables = trained
    out = tmp_path / "publish"
    plan = run(out, surrogates, tables, "--dry-run")

    assert [(r["repo_id"], r["repo_type"]) for r in plan["repos"]] == [
        ("me/KVzap-linear-Qwen3-8B", "model"),
        ("me/KVzap-mlp-Qwen3-8B", "model"),
        ("me/KVzap-results", "dataset"),
    ]
    assert plan["params"]["dry_run"] is True and plan["git_commit"]
    for kind, (_, original) in surrogates.items():
        folder = out / "models" / f"KVzap-{kind}-Qwen3-8B"
        assert sorted(p.name for p in folder.iterdir()) == [
            "README.md",
            "config.json",
            "metrics.json",
            "model.safetensors",
        ]
        theirs = KVzapModel.from_pretrained(folder)  # transformers' from_pretrained, as kvpress uses it
        ours = Surrogate.from_pretrained(folder)
        h = torch.randn(5, 3, 16)
        with torch.no_grad():
            torch.testing.assert_close(theirs(h), original(h))
            torch.testing.assert_close(ours(h), original(h))
        card = ModelCard.load(folder / "README.md")
        assert card.data.base_model == BASE and card.data.license == "apache-2.0"
        assert card.data.datasets == ["me/KVzap-results"]
        assert "| **all** | **0.450** |" in card.text  # R^2 table
        assert f'surrogate_path="me/KVzap-{kind}-Qwen3-8B"' in card.text  # usage snippet
        assert "rev123" in card.text and "## License" in card.text
    # tau -> compression: mean over benchmarks of this model and kind only
    mlp_card = (out / "models" / "KVzap-mlp-Qwen3-8B" / "README.md").read_text()
    assert "| -5 | 0.300 |" in mlp_card and "| -3 | 0.700 |" in mlp_card
    linear_card = (out / "models" / "KVzap-linear-Qwen3-8B" / "README.md").read_text()
    assert "| -5 | 0.100 |" in linear_card and "| -3 | 0.500 |" in linear_card

    dataset = out / "datasets" / "KVzap-results"
    assert DatasetCard.load(dataset / "README.md").data.pretty_name
    for table in tables:
        loaded = load_dataset(str(dataset), table.stem, split="train", cache_dir=str(tmp_path / "hf-cache"))
        pd.testing.assert_frame_equal(loaded.to_pandas(), pd.read_csv(table), check_dtype=False)


def test_offline_demo_model_has_no_hub_base_model(tmp_path):
    folder, _ = make_surrogate(tmp_path, "linear", base_model="offline/SmolLM2-135M-Instruct")
    entry = publish.build_model_repo(folder, tmp_path / "out", "me", [], None, "apache-2.0")
    assert entry["repo_id"] == "me/KVzap-linear-SmolLM2-135M-Instruct"
    card = ModelCard.load(Path(entry["folder"]) / "README.md")
    assert card.data.base_model is None  # not a Hub id: the Hub would reject the metadata
    assert "No threshold sweep" in card.text


class FakeHub:
    """The Hub's HTTP endpoints that create_repo and upload_folder call, recording each request."""

    def __init__(self):
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if request.method == "GET":  # optional metadata look-ups: answer "nothing there"
            return httpx.Response(404, json={"error": "not found"})
        if path == "/api/repos/create":
            body = json.loads(request.content)
            prefix = "datasets/" if body["type"] == "dataset" else ""
            return httpx.Response(
                200, json={"url": f"https://huggingface.co/{prefix}{body['organization']}/{body['name']}"}
            )
        if path == "/api/validate-yaml":
            return httpx.Response(200, json={"errors": [], "warnings": []})
        if "/preupload/" in path:
            files = json.loads(request.content)["files"]
            return httpx.Response(
                200,
                json={"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]},
            )
        if "/commit/" in path:  # /api/{models,datasets}/<ns>/<name>/commit/main
            kind, repo = path.split("/")[2], "/".join(path.split("/")[3:5])
            prefix = "datasets/" if kind == "datasets" else ""
            return httpx.Response(
                200,
                json={
                    "commitUrl": f"https://huggingface.co/{prefix}{repo}/commit/{'a' * 40}",
                    "commitOid": "a" * 40,
                    "pullRequestUrl": None,
                },
            )
        return httpx.Response(500, json={"error": f"unexpected {request.method} {path}"})

    def posts(self) -> list[httpx.Request]:
        return [r for r in self.requests if r.method == "POST"]


@pytest.fixture
def fake_hub():
    hub = FakeHub()
    huggingface_hub.close_session()
    huggingface_hub.set_client_factory(lambda: httpx.Client(transport=httpx.MockTransport(hub)))
    yield hub
    huggingface_hub.close_session()
    huggingface_hub.set_client_factory(huggingface_hub.utils._http.default_client_factory)


def test_upload_goes_through_the_hub_api_with_the_env_token(trained, tmp_path, monkeypatch, fake_hub):
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    surrogates, tables = trained
    out = tmp_path / "publish"
    plan = run(out, surrogates, tables, "--private")

    posts = fake_hub.posts()
    assert all(r.headers["authorization"] == f"Bearer {TOKEN}" for r in posts)
    assert [r.url.path for r in posts] == [
        path
        for repo, kind in [
            ("me/KVzap-linear-Qwen3-8B", "models"),
            ("me/KVzap-mlp-Qwen3-8B", "models"),
            ("me/KVzap-results", "datasets"),
        ]
        for path in (
            "/api/repos/create",
            "/api/validate-yaml",
            f"/api/{kind}/{repo}/preupload/main",
            f"/api/{kind}/{repo}/commit/main",
        )
    ]
    creates = [json.loads(r.content) for r in posts if r.url.path == "/api/repos/create"]
    assert creates == [
        {"name": "KVzap-linear-Qwen3-8B", "organization": "me", "visibility": "private", "type": "model"},
        {"name": "KVzap-mlp-Qwen3-8B", "organization": "me", "visibility": "private", "type": "model"},
        {"name": "KVzap-results", "organization": "me", "visibility": "private", "type": "dataset"},
    ]
    # each commit carries exactly the files of the folder the dry run would have written, byte for byte
    commits = [r for r in posts if "/commit/" in r.url.path]
    for request, entry in zip(commits, plan["repos"]):
        lines = [json.loads(line) for line in request.content.decode().splitlines()]
        assert lines[0]["key"] == "header"
        sent = {line["value"]["path"]: base64.b64decode(line["value"]["content"]) for line in lines[1:]}
        folder = Path(entry["folder"])
        assert sent == {p.name: p.read_bytes() for p in folder.iterdir()}
        assert entry["commit_url"].endswith(f"{entry['repo_id']}/commit/{'a' * 40}")
    assert plan["params"]["dry_run"] is False and plan["params"]["private"] is True
    # the token reaches the Hub's headers only, never a file
    for path in out.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path


def test_upload_without_token_refuses_before_any_request(trained, tmp_path, monkeypatch, fake_hub):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    surrogates, tables = trained
    with pytest.raises(SystemExit, match="HF_TOKEN"):
        run(tmp_path / "publish", surrogates, tables)
    assert fake_hub.requests == []
    assert not (tmp_path / "publish").exists()


def test_missing_surrogate_file_is_named(tmp_path):
    folder, _ = make_surrogate(tmp_path, "mlp")
    (folder / "metrics.json").unlink()
    with pytest.raises(Refusal, match="metrics.json"):
        publish.build_model_repo(folder, tmp_path / "out", "me", [], None, "apache-2.0")


def test_tau_curve_matches_the_model_by_config_key(tmp_path):
    table = tmp_path / "results.csv"
    pd.DataFrame(
        {
            "model": ["qwen3-8b", "qwen3-8b", "other"],
            "method": ["kvzap_linear"] * 3,
            "value": [-4.0, float("nan"), -4.0],
            "compression_ratio": [0.5, 0.0, 0.9],
        }
    ).to_csv(table, index=False)
    curve = publish.tau_curve([table], {"qwen3-8b"}, "linear")
    assert curve.to_dict("records") == [{"threshold": -4.0, "compression_ratio": 0.5}]
    assert publish.tau_curve([table], {"Qwen3-8B"}, "linear").empty
