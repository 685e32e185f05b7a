"""The paper's figures, drawn from results/tables/results.csv (and the surrogates' held-out predictions).

Kinds (config `figures:`):
  tradeoff            score vs compression ratio, one panel per model (Figs 1-4, 12; AIME: pass@1 solid, pass@4 dashed)
  per_task            one panel per task of a benchmark, for one model (Figs 9-11, 13-15)
  ratio_distribution  per-prompt compression ratios of one KVzap configuration on each benchmark (Fig 5 left)
  threshold_vs_topk   thresholding vs fixed top-k per head vs per layer (Fig 5 right)
  surrogate_fit       KVzip+ score distribution, per-head R^2 MLP vs linear, share below the median, R^2 heatmap (Figs 6-8)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

import kvzap  # noqa: E402
from kvzap import registry  # noqa: E402
from kvzap.io import atomic_path  # noqa: E402
from kvzap.provenance import git_commit  # noqa: E402

MARKERS = "osD^vP*Xh<>p"
STYLE = {"kvzap_mlp": dict(color="#76b900", lw=2.2), "kvzap_linear": dict(color="#1f6f3f", lw=2.2)}


def _save(fig, out: Path) -> None:
    fig.tight_layout()
    origin = f"kvzap {kvzap.__version__}, commit {git_commit()}"
    # Provenance in the file's metadata; no creation date, so reruns and cluster runs give identical files.
    metadata = {".png": {"Software": origin}, ".pdf": {"Creator": origin, "CreationDate": None}}
    for suffix in (".png", ".pdf"):
        with atomic_path(out.with_suffix(suffix)) as tmp:
            fig.savefig(tmp, format=suffix[1:], dpi=150, metadata=metadata[suffix])
    plt.close(fig)


def _curves(ax, cells: pd.DataFrame, metric: str, methods: list[str] | None, linestyle: str = "-", legend=True):
    """One line per method (sorted by compression ratio); the full cache as a dashed horizontal line."""
    for i, (method, group) in enumerate(cells.groupby("method", sort=False)):
        if methods and method not in methods or metric not in group or group[metric].isna().all():
            continue
        if method == "full":
            ax.axhline(group[metric].mean(), color="black", ls="--", lw=1, label=registry.label(method) if legend else None)
            continue
        group = group.sort_values("compression_ratio")
        ax.plot(group["compression_ratio"], group[metric], marker=MARKERS[i % len(MARKERS)], ms=4, ls=linestyle,
                label=registry.label(method) if legend else None, **STYLE.get(method, {}))
    ax.set_xlabel("Compression ratio")
    ax.grid(alpha=0.3)


def tradeoff(results: pd.DataFrame, spec: dict, out: Path) -> None:
    cells = results[results["benchmark"] == spec["benchmark"]]
    models = spec.get("models") or sorted(cells["model"].unique())
    fig, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    aime = (cells["benchmark_type"] == "aime25").any()
    for ax, model in zip(axes[0], models):
        data = cells[cells["model"] == model].groupby(["method", "value"], dropna=False, sort=False).mean(numeric_only=True).reset_index()
        if aime:
            _curves(ax, data, "pass@1", spec.get("methods"))
            _curves(ax, data, "pass@4", spec.get("methods"), linestyle="--", legend=False)
            ax.set_ylabel("pass@1 (solid), pass@4 (dashed)")
        else:
            _curves(ax, data, spec.get("metric", "average"), spec.get("methods"))
            ax.set_ylabel(spec.get("metric", "average").replace("_", " "))
        if spec.get("ylim"):
            ax.set_ylim(*spec["ylim"])
        ax.set_title(model)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(spec.get("title", spec["benchmark"]))
    _save(fig, out)


def per_task(results: pd.DataFrame, spec: dict, out: Path) -> None:
    cells = results[results["benchmark"] == spec["benchmark"]]
    model = spec.get("model") or sorted(cells["model"].unique())[0]
    cells = cells[cells["model"] == model]
    tasks = [c for c in cells.columns if c.startswith("task:") and cells[c].notna().any()]
    cols = min(4, len(tasks))
    rows = -(-len(tasks) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 3.2 * rows), squeeze=False)
    data = cells.groupby(["method", "value"], dropna=False, sort=False).mean(numeric_only=True).reset_index()
    for ax, task in zip(axes.flat, tasks):
        _curves(ax, data, task, spec.get("methods"), legend=ax is axes.flat[0])
        ax.set_title(task.removeprefix("task:"))
    for ax in list(axes.flat)[len(tasks):]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=6)
    fig.suptitle(spec.get("title", f"{spec['benchmark']} per task, {model}"))
    _save(fig, out)


def ratio_distribution(results: pd.DataFrame, spec: dict, out: Path, predictions: list[Path]) -> None:
    """Per-prompt compression of one (method, value), per benchmark; each cell names itself in its metrics.json."""
    model = spec.get("model") or sorted(results["model"].unique())[0]
    by_bench: dict[str, list[pd.Series]] = {}
    for path in predictions:
        cell = json.loads((path.parent / "metrics.json").read_text())
        if cell["model"] == model and cell["method"] == spec["method"] and cell["value"] == spec["value"]:
            by_bench.setdefault(cell["bench"], []).append(pd.read_csv(path)["compression_ratio"])
    data, names = [], []
    for bench in spec.get("benchmarks") or sorted(by_bench):
        ratios = pd.concat(by_bench[bench]) if bench in by_bench else pd.Series(dtype=float)
        data.append(ratios.to_numpy())
        names.append(f"{bench}\n(mean {ratios.mean():.2f})")
    fig, ax = plt.subplots(figsize=(2.2 * len(data) + 2, 4))
    ax.violinplot([d for d in data if len(d)], showmedians=True)
    ax.set_xticks(range(1, len(names) + 1), names)
    ax.set_ylabel("Per-prompt compression ratio")
    ax.set_title(spec.get("title", f"{registry.label(spec['method'])}, tau = {spec['value']:g}, {model}"))
    _save(fig, out)


def threshold_vs_topk(results: pd.DataFrame, spec: dict, out: Path) -> None:
    spec = {**spec, "methods": spec.get("methods") or ["full", "kvzap_mlp", "kvzap_mlp_head", "kvzap_mlp_layer"]}
    tradeoff(results, {**spec, "title": spec.get("title", "Thresholding vs fixed top-k")}, out)


def surrogate_fit(spec: dict, out: Path, surrogates: list[tuple[str, Path, Path]]) -> None:
    """Per model (its linear and MLP surrogate folders): held-out scores, per-head R^2 of both, layer shares."""
    fig, axes = plt.subplots(len(surrogates), 4, figsize=(18, 3.8 * len(surrogates)), squeeze=False)
    for row, (model, linear, mlp) in zip(axes, surrogates):
        r2 = {kind: torch.tensor(json.loads((folder / "metrics.json").read_text())["r2"])
              for kind, folder in (("linear", linear), ("mlp", mlp))}
        y_true = load_file(str(mlp / "test_predictions.safetensors"))["y_true"]  # (N, L, H)
        row[0].hist(y_true.flatten().numpy(), bins=80, color="#76b900")
        row[0].set(title=f"{model}: KVzip+ log-scores (test)", xlabel="log score")
        row[1].scatter(r2["mlp"].flatten(), r2["linear"].flatten(), s=6, c=torch.arange(r2["mlp"].shape[0]).repeat_interleave(r2["mlp"].shape[1]), cmap="viridis")
        row[1].plot([0, 1], [0, 1], "k--", lw=0.8)
        row[1].set(title=f"per-head R^2 (mean MLP {r2['mlp'].mean():.3f}, linear {r2['linear'].mean():.3f})", xlabel="MLP", ylabel="Linear")
        below = (y_true < y_true.flatten().median()).float().mean(dim=(0, 2))
        row[2].bar(range(len(below)), below.numpy(), color="#1f6f3f")
        row[2].set(title="share of KV pairs below the median score", xlabel="layer")
        image = row[3].imshow(r2["mlp"].T.numpy(), aspect="auto", cmap="viridis", vmin=0, vmax=1)
        row[3].set(title="MLP R^2 per head", xlabel="layer", ylabel="KV head")
        fig.colorbar(image, ax=row[3])
    _save(fig, out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True, help="results.csv")
    parser.add_argument("--predictions", type=Path, nargs="*", default=[],
                        help="cells' predictions.csv (ratio_distribution), each beside its metrics.json")
    parser.add_argument("--surrogate", nargs=3, action="append", default=[], metavar=("MODEL", "LINEAR", "MLP"),
                        help="a model's two surrogate folders (surrogate_fit), once per model")
    parser.add_argument("--spec", required=True, help="the figure's config entry, as JSON")
    parser.add_argument("--out", type=Path, required=True, help="PNG path (a PDF is written beside it)")
    args = parser.parse_args()
    spec = json.loads(args.spec)
    results = pd.read_csv(args.results)
    kind = spec["kind"]
    if kind == "surrogate_fit":
        surrogate_fit(spec, args.out, [(model, Path(linear), Path(mlp)) for model, linear, mlp in args.surrogate])
    elif kind == "ratio_distribution":
        ratio_distribution(results, spec, args.out, args.predictions)
    else:
        {"tradeoff": tradeoff, "per_task": per_task, "threshold_vs_topk": threshold_vs_topk}[kind](results, spec, args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
