"""The training-data ablation: pair selection by source, calibration from one recorded prefill, its table and figure."""

import json

import pytest
import torch

from kvzap.ablations import training_data
from kvzap.pruning import SurrogateScorerPress
from kvzap.pruning.calibration import collect_scores
from kvzap.refusal import Refusal
from kvzap.report import aggregate, figures
from kvzap.surrogate.model import Surrogate
from kvzap.training.shards import write_shard
from tiny_models import TEXT, tiny_model, tiny_tokenizer


def _split(folder, subsets, pairs_per_prompt=5, dim=4):
    folder.mkdir(parents=True)
    n = len(subsets) * pairs_per_prompt
    prompt = torch.arange(n) // pairs_per_prompt
    shards = [
        write_shard(
            folder / f"shard-{i:05d}.safetensors",
            {"h": torch.randn(len(rows), 1, dim), "y": torch.randn(len(rows), 1, 1), "prompt": prompt[rows]},
        )
        for i, rows in enumerate(torch.arange(n).split(7))
    ]
    (folder / "manifest.json").write_text(json.dumps({"shards": shards, "n_pairs": n, "prompt_subsets": subsets}))


def test_pairs_come_first_from_the_chosen_sources(tmp_path, capsys):
    _split(tmp_path / "train", ["code", "essays", "code", "news", "essays"])
    sources = {"all": None, "prose": ["essays"], "mixed": ["code", "news"]}
    chosen = training_data.selections(tmp_path / "train", sources, [7, 12])
    assert chosen["all", 7].tolist() == list(range(7)) and chosen["all", 12].tolist() == list(range(12))
    assert chosen["prose", 7].tolist() == [5, 6, 7, 8, 9, 20, 21]
    assert ("prose", 12) not in chosen and "fewer than 12" in capsys.readouterr().out  # essays hold only 10
    assert chosen["mixed", 12].tolist() == [*range(5), *range(10, 17)]
    with pytest.raises(Refusal, match="holds 25 pairs, not 26"):
        training_data.selections(tmp_path / "train", sources, [26])


def test_sources_parse():
    assert training_data.parse_sources(["all", "prose=essays,news"]) == {"all": None, "prose": ["essays", "news"]}


@pytest.mark.parametrize("hidden", [None, 8])
def test_one_recorded_prefill_gives_what_a_press_would_judge(hidden):
    """Scores from the recorded attention inputs equal those a recording press collects in its own prefill."""
    tok = tiny_tokenizer()
    model = tiny_model("llama", len(tok))
    torch.manual_seed(1)
    surrogate = Surrogate(
        model.config.hidden_size, model.config.num_key_value_heads, model.config.num_hidden_layers, hidden
    ).eval()
    ids = [tok(TEXT[:n], return_tensors="pt")["input_ids"] for n in (700, 900)]
    window = training_data.WINDOW
    assert all(i.shape[1] > window for i in ids)
    reference = collect_scores(model, ids, SurrogateScorerPress(surrogate=surrogate, check_base_model=False), window)
    ours = training_data.score_samples(surrogate, training_data.attention_inputs(model, ids))
    for a, b in zip(reference, ours):
        assert a.entries_per_layer == b.entries_per_layer
        for x, y in zip(a.layer_scores, b.layer_scores):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)


RESULT = {
    "model_id": "org/m",
    "target_ratio": 0.6,
    "n_samples": 30,
    "full": {"average": 80.0, "average_ci": [65.0, 90.0]},
    "rows": [
        {
            "sources": s,
            "n_pairs": n,
            "kind": k,
            "best_epoch": 3 if k == "mlp" else None,
            "r2_mean": r2,
            "r2_mean_ci": [r2 - 0.02, r2 + 0.02],
            "r2_benchmark": r2 - 0.2,
            "r2_benchmark_ci": [r2 - 0.25, r2 - 0.15],
            "threshold": -4.0,
            "calibrated_ratio": 0.6,
            "compression_ratio": 0.59,
            "average": acc,
            "average_ci": [acc - 10, acc + 10],
            "per_task": {},
            "per_task_ci": {},
        }
        for s, n, k, r2, acc in [
            ("all", 100, "linear", 0.5, 70.0),
            ("all", 100, "mlp", 0.4, 50.0),
            ("all", 1000, "linear", 0.6, 75.0),
            ("all", 1000, "mlp", 0.65, 78.0),
        ]
    ],
}


def test_table_and_figure(tmp_path):
    path = tmp_path / "training_pairs.json"
    path.write_text(json.dumps(RESULT))
    table = aggregate.training_pairs_table([path])
    assert list(table["kind"]) == ["full cache", "linear", "mlp", "linear", "mlp"]
    assert table.loc[4, "r2_ci_high"] == pytest.approx(0.67) and table.loc[0, "average_ci_low"] == 65.0
    assert table.loc[4, "r2_benchmark"] == pytest.approx(0.45) and table.loc[4, "r2_benchmark_ci_low"] == pytest.approx(
        0.4
    )
    out = tmp_path / "fig.png"
    figures.training_pairs({"kind": "training_pairs"}, out, [path])
    assert out.exists() and out.with_suffix(".pdf").exists()


def test_curves_draw_intervals():
    import matplotlib.pyplot as plt
    import pandas as pd

    cells = pd.DataFrame(
        {
            "method": ["full", "knorm", "knorm"],
            "value": [None, 0.5, 0.75],
            "compression_ratio": [0.0, 0.5, 0.75],
            "average": [80.0, 60.0, 40.0],
            "ci_low:average": [70.0, 50.0, 30.0],
            "ci_high:average": [88.0, 69.0, 52.0],
        }
    )
    fig, ax = plt.subplots()
    figures._curves(ax, cells, "average", None)
    (bars,) = ax.containers
    segments = bars.lines[2][0].get_segments()
    assert [tuple(s[:, 1]) for s in segments] == [(50.0, 69.0), (30.0, 52.0)]
    assert len(ax.patches) == 1  # the full cache's band
    plt.close(fig)


def test_benchmark_pairs_are_the_oracle_of_every_context_token():
    """Every context token of each benchmark context, with the oracle's own scores and attention inputs."""
    from kvzap.oracle.scores import build_repeat_prompt, oracle_scores

    tok = tiny_tokenizer()
    model = tiny_model("llama", len(tok))
    contexts = [TEXT[:300], TEXT[400:650]]
    h, y, index = training_data.benchmark_pairs(model, tok, contexts)
    lengths = [len(build_repeat_prompt(tok, c).input_ids[0, build_repeat_prompt(tok, c).context]) for c in contexts]
    assert index.tolist() == [0] * lengths[0] + [1] * lengths[1]
    c = model.config
    assert h.shape == (sum(lengths), c.num_hidden_layers, c.hidden_size)
    assert y.shape == (sum(lengths), c.num_hidden_layers, c.num_key_value_heads)
    second = oracle_scores(model, build_repeat_prompt(tok, contexts[1]))
    torch.testing.assert_close(y[lengths[0] :], second.kvzip_plus_log.permute(2, 0, 1).float())


def test_methods_at_one_ratio_are_spread_apart():
    """A single-ratio run puts every method at ~0.6: each gets its own x around the mean ratio, and the axis gives
    the true range; methods at different ratios keep their true x."""
    import matplotlib.pyplot as plt
    import pandas as pd

    one = pd.DataFrame(
        {
            "method": ["full", "knorm", "kvzip", "kvzap_mlp"],
            "value": [None, 0.6, 0.6, -3.0],
            "compression_ratio": [0.0, 0.6, 0.6, 0.604],
            "average": [50.0, 20.0, 45.0, 60.0],
        }
    )
    fig, ax = plt.subplots()
    figures._curves(ax, one, "average", None)
    xs = [line.get_xdata()[0] for line in ax.lines if line.get_linestyle() != "--"]
    centre = (0.6 + 0.6 + 0.604) / 3
    assert xs == pytest.approx([centre - 0.01, centre, centre + 0.01])
    assert ax.get_xlabel() == "Compression ratio 0.60-0.60 (side by side)"
    plt.close(fig)
    spread = one.assign(compression_ratio=[0.0, 0.25, 0.5, 0.75])
    fig, ax = plt.subplots()
    figures._curves(ax, spread, "average", None)
    assert [line.get_xdata()[0] for line in ax.lines if line.get_linestyle() != "--"] == [0.25, 0.5, 0.75]
    assert ax.get_xlabel() == "Compression ratio"
    plt.close(fig)


def test_an_interval_that_misses_its_estimate_draws_no_negative_bar():
    """A bootstrap interval can lie beside its point estimate (the CI config's few prompts did that to R^2, and
    matplotlib refused the figure): that side of the bar has length zero."""
    below, above = figures._yerr([0.70, 0.5], [0.72, 0.4], [0.80, 0.6])
    assert below.tolist() == [0.0, pytest.approx(0.1)] and above.tolist() == [pytest.approx(0.1), pytest.approx(0.1)]
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.errorbar([0.7], [0.7], xerr=figures._yerr([0.7], [0.72], [0.8]), yerr=figures._yerr([0.7], [0.6], [0.69]))
    plt.close(fig)
