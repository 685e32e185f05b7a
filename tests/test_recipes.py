"""Training recipes compared (kvzap.ablations.recipes): every surrogate on every recipe's held-out text, R^2 as
computed by hand, and KVzap cells paired across recipes (and an MLP with its recipe's Linear) by sample id at matched
compression."""

import numpy as np
import torch

from kvzap.ablations import recipes
from kvzap.plan import paths
from kvzap.training import fit
from oracle_data import synthetic_split
from test_claims import cell


def test_each_recipes_surrogates_on_each_recipes_held_out_text(tmp_path):
    config = {
        "results": str(tmp_path),
        "models": {"paper": {}, "demo": {}},
        "training": {"surrogates": ["linear"], "seeds": [42]},
        "seed": 42,
    }
    truth = {}
    for seed, model in enumerate(config["models"]):
        oracle = tmp_path / model / "oracle"
        synthetic_split(oracle / "train", seed=seed)
        truth[model] = synthetic_split(oracle / "test", n=200, seed=seed + 10)
        fit.fit_ridge(oracle / "train", 1.0).save_pretrained(paths.surrogate_dir(str(tmp_path), model, "linear"))
    rows = recipes.held_out_fits(config)
    assert [(r["recipe"], r["on"]) for r in rows] == [
        ("paper", "paper held-out"),
        ("paper", "demo held-out"),
        ("demo", "paper held-out"),
        ("demo", "demo held-out"),
    ]
    for row in rows:  # the squared Pearson correlation per (layer, head), averaged, by numpy
        folder = paths.surrogate_dir(str(tmp_path), row["recipe"], "linear")
        x, y = truth[row["on"].split()[0]]
        with torch.no_grad():
            pred = recipes.Surrogate.from_pretrained(folder)(x).numpy()
        r = [
            np.corrcoef(y[:, layer, head].numpy(), pred[:, layer, head])[0, 1] ** 2
            for layer in range(y.shape[1])
            for head in range(y.shape[2])
        ]
        assert abs(row["r2"] - np.mean(r)) < 1e-3 and row["ci"][0] <= row["r2"] <= row["ci"][1]
    # each fit is best on its own data's held-out text (their linear maps differ)
    by = {(r["recipe"], r["on"]): r["r2"] for r in rows}
    assert by["paper", "paper held-out"] > by["demo", "paper held-out"]


def test_cells_pair_across_recipes_by_sample_at_matched_ratios():
    full = cell("full", "none", [1] * 40, 0.0)
    paper = cell("kvzap_mlp", "-3", [1] * 40, 0.70)
    demo = cell("kvzap_mlp", "-2.8", [1] * 20 + [0] * 20, 0.72, bench="few")
    far = cell("kvzap_linear", "-2.8", [1] * 40, 0.30, bench="few")
    for c, model in ((full, "paper"), (paper, "paper"), (demo, "demo"), (far, "demo")):
        c.metrics["model"] = model
    rows = {(r["recipe"], r["method"]): r for r in recipes.accuracy([full, paper, demo, far])}
    assert rows["paper", "kvzap_mlp"]["vs_other_recipe"]["difference"] > 0
    assert rows["demo", "kvzap_mlp"]["vs_other_recipe"]["recipe"] == "paper"
    assert rows["demo", "kvzap_mlp"]["vs_full"]["difference"] < 0
    assert "vs_other_recipe" not in rows["demo", "kvzap_linear"]  # no Linear cell of the other recipe


def test_each_mlp_seed_meets_its_recipes_linear_and_the_same_seed_of_the_other_recipe():
    linear = cell("kvzap_linear", "-2.6", [1] * 40, 0.70, bench="2k")
    seeds = {42: cell("kvzap_mlp", "-2.6", [1] * 40, 0.69, bench="2k"), 43: cell("kvzap_mlp", "-2.6", [0] * 40, 0.71)}
    other = cell("kvzap_mlp", "-2.6", [1] * 20 + [0] * 20, 0.68, bench="2k")
    far_linear = cell("kvzap_linear", "-1.6", [0] * 40, 0.80, bench="2k")
    for seed, c in seeds.items():
        c.seed, c.bench = seed, "2k"
        c.metrics["model"] = "paper"
    other.seed = 43
    for c, model in ((linear, "paper"), (other, "demo"), (far_linear, "paper")):
        c.metrics["model"] = model
    rows = recipes.accuracy([linear, far_linear, *seeds.values(), other])
    by = {(r["recipe"], r["method"], r["seed"]): r for r in rows}
    assert by["paper", "kvzap_mlp", 42]["vs_linear"]["difference"] == 0  # both keep every needle
    assert by["paper", "kvzap_mlp", 43]["vs_linear"]["difference"] == -100
    assert "-2.6" in by["paper", "kvzap_mlp", 43]["vs_linear"]["b"]  # the Linear cell at 0.70, not the one at 0.80
    assert by["paper", "kvzap_mlp", 43]["vs_other_recipe"]["recipe"] == "demo"  # seed 43 meets seed 43 only
    assert "vs_other_recipe" not in by["paper", "kvzap_mlp", 42]
    assert "vs_linear" not in by["paper", "kvzap_linear", None]
