"""The tables of docs/results.md, benchmarks/README.md and plugins/vllm/README.md, rendered from their committed
records.

Each table is a header and rows of cells formatted here, and sits in its doc right after its marker text.
`python benchmarks/doc_tables.py --fix` rewrites every table from its record; tests/test_docs_records.py holds each
doc to the rendering, so a doc edited by hand or a record replaced without its table fails there. Records are read
when a table is rendered, not at import."""

from __future__ import annotations

import argparse
import json
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS, BENCHMARKS, PLUGIN = "docs/results.md", "benchmarks/README.md", "plugins/vllm/README.md"
BLOCK = re.compile(r"(?:^ *\|.*\|\n)+", re.MULTILINE)  # a Markdown table: consecutive lines of cells


def rec(name: str):
    """A committed record, by its path under benchmarks/."""
    return json.loads((ROOT / "benchmarks" / name).read_text())


def num(value: float, digits: int = 1) -> str:
    """A number as the docs print it: fixed digits, a typographic minus."""
    return f"{value:.{digits}f}".replace("-", "−")


def signed(value: float, digits: int = 1) -> str:
    return ("+" if value >= 0 else "") + num(value, digits)


def joined(values, digits: int = 1) -> str:
    return " / ".join(num(v, digits) for v in values)


def small(value: float, digits: int) -> str:
    """A small number in scientific notation as the docs print it: 2.4e-5, not 2.4e-05."""
    return f"{value:.{digits}e}".replace("e-0", "e-")


def times(value: float, digits: int = 2) -> str:
    return f"{num(value, digits)}×"


def score_ci(average: float, low: float, high: float) -> str:
    return f"{num(average)} [{num(low)}, {num(high)}]"


def cell(record: dict, method: str, value=None) -> dict:
    """One evaluated cell of a demo record (the full cache has no value)."""
    return next(c for c in record["cells"] if c["method"] == method and (value is None or c["value"] == value))


# --- docs/results.md ---------------------------------------------------------------------------------------------

DEMO_TAUS = (-2.6, -1.6, -1.0)
NAMES = {"full": "full cache", "kvzap_linear": "KVzap-Linear", "kvzap_mlp": "KVzap-MLP"}
BASELINES = (("full", None, "full cache"), ("kvzip", 0.6, "KVzip 0.6"))
BASELINES += (("streaming_llm", 0.6, "StreamingLLM 0.6"), ("knorm", 0.6, "Knorm 0.6"))


def demo_dtype_rows() -> list[list[str]]:
    """The float32 (AVX2 kernels) and bfloat16 (AMX) demo runs side by side; the τ labels' ratios are the first
    run's (the two agree to three decimals: test_both_dtypes_print_the_same_ratios)."""
    runs = rec("cpu/demo_run_avx2.json"), rec("cpu/demo_run_amx.json")
    stages = ("prepare", "oracle", "surrogates", "evaluation")
    rows = [
        ["install (empty pip cache, local PyPI mirror)", *(f"{r['install_s']:.0f} s" for r in runs)],
        [" / ".join(stages), *(" / ".join(f"{r['stage_s'][s]:.0f}" for s in stages) + " s" for r in runs)],
        ["`make demo`, install included", *(f"{r['total_s']:.0f} s" for r in runs)],
        ["held-out R², Linear / MLP", *(joined((s["r2_mean"] for s in r["surrogates"]), 4) for r in runs)],
    ]
    for method in ("kvzap_linear", "kvzap_mlp"):
        taus = " / ".join(f"{num(t)} ({cell(runs[0], method, t)['compression_ratio']:.3f})" for t in DEMO_TAUS)
        rows.append(
            [f"{NAMES[method]} at τ {taus}", *(joined(cell(r, method, t)["average"] for t in DEMO_TAUS) for r in runs)]
        )
    rows.append(
        [
            " / ".join(name for _, _, name in BASELINES),
            *(joined(cell(r, m, v)["average"] for m, v, _ in BASELINES) for r in runs),
        ]
    )
    return rows


def more_data_rows() -> list[list[str]]:
    """The demo with twice the oracle data (one run)."""
    run = rec("cpu/demo_more_data.json")
    rows = []
    chosen = [("full", None)] + [("kvzap_mlp", t) for t in DEMO_TAUS] + [("kvzap_linear", t) for t in DEMO_TAUS[:2]]
    for method, tau in chosen:
        c = cell(run, method, tau)
        ratio = "0" if tau is None else f"{c['compression_ratio']:.3f}"
        score = score_ci(c["average"], c["ci_low:average"], c["ci_high:average"])
        rows.append([NAMES[method], "–" if tau is None else num(tau), ratio, score])
    streaming, knorm = cell(run, "streaming_llm", 0.6), cell(run, "knorm", 0.6)
    ratios = {f"{c['compression_ratio']:.1f}" for c in (streaming, knorm)}
    if len(ratios) != 1:
        raise ValueError(f"the StreamingLLM / Knorm row prints one ratio for both, but they are {ratios}")
    return rows + [["StreamingLLM / Knorm", "0.6", ratios.pop(), joined([streaming["average"], knorm["average"]])]]


def oracle_ceiling_rows() -> list[list[str]]:
    """KVzapPress fed the oracle's own scores, at each threshold."""
    return [
        [r["scores"], num(r["threshold"]), f"{r['compression_ratio']:.3f}", score_ci(r["average"], *r["average_ci"])]
        for r in rec("cpu/oracle_ceiling_demo.json")
    ]


def training_pairs_rows() -> list[list[str]]:
    """Both surrogates against their training pairs; the essays-only rows have no benchmark R² (NaN, printed –)."""
    return [
        [
            r["sources"],
            f"{r['n_pairs']:,}",
            r["kind"].replace("linear", "Linear").replace("mlp", "MLP"),
            f"{r['r2_mean']:.3f}",
            "–" if math.isnan(r["r2_benchmark"]) else f"{r['r2_benchmark']:.3f}",
            num(r["threshold"], 2),
            score_ci(r["average"], *r["average_ci"]),
        ]
        for r in rec("cpu/training_pairs.json")["rows"]
    ]


def essay_rows() -> list[list[str]]:
    """The demo's surrogates on held-out 2k-token essays, the bfloat16 run beside the AVX2 one: each machine's ratio,
    then its score (for KVzap-MLP: the mean over seeds, then each seed's)."""
    runs = rec("cpu/essay_check_bf16.json")["cells"], rec("cpu/essay_check_avx2.json")["cells"]

    def machine(cells: list[dict], kind: str, tau) -> list[str]:
        chosen = [c for c in cells if c["kind"] == kind and c["threshold"] == tau]
        scores = [c["score"] for c in chosen]
        ratio = "0" if kind == "full" else f"{chosen[0]['ratio']:.3f}"
        if kind != "mlp":
            return [ratio, num(scores[0])]
        return [ratio, f"{num(sum(scores) / len(scores))} (seeds {joined(scores)})"]

    keys = [("full", None)] + [(kind, tau) for kind in ("linear", "mlp") for tau in DEMO_TAUS]
    return [
        [
            NAMES["full" if kind == "full" else f"kvzap_{kind}"],
            "–" if tau is None else num(tau),
            *(x for cells in runs for x in machine(cells, kind, tau)),
        ]
        for kind, tau in keys
    ]


def science_order(key: tuple) -> tuple:
    """The reference cell first, then one change from it at a time."""
    rows, score_dtype, data, setting = key
    return (rows != "demo", score_dtype != "float32", data != "bf16x2", setting != "paper", key)


def science_rows() -> list[list[str]]:
    """Each candidate's cells in benchmarks/demo_science.py's record: MLP mean over seeds, Linear, MLP - Linear."""
    effects = rec("cpu/demo_science.json")["effects"]
    keys = sorted({(e["rows"], e["score_dtype"], e["data"], e["setting"]) for e in effects}, key=science_order)
    rows = []
    for key in keys:
        by_tau = {e["threshold"]: e for e in effects if (e["rows"], e["score_dtype"], e["data"], e["setting"]) == key}
        ordered = [by_tau[t] for t in sorted(by_tau)]
        rows.append(
            [
                *key,
                joined(e["mlp_mean"] for e in ordered),
                joined(e["linear"] for e in ordered),
                " / ".join(signed(e["mlp_minus_linear"]) for e in ordered),
            ]
        )
    return rows


# --- benchmarks/README.md ------------------------------------------------------------------------------------------


def oracle_rows() -> list[list[str]]:
    rows = []
    for r in rec("cpu/oracle_demo.json"):
        context = f"{r['context_tokens']}" + (" (the demo's passages)" if r["context_tokens"] == 512 else "")
        speeds = [f"{r[k]:.1f}" for k in ("ours_tokens_per_s", "ref_tokens_per_s", "plain_tokens_per_s")]
        peaks = [f"{r[k]:.0f}" for k in ("ours_peak_mb", "ref_peak_mb", "plain_peak_mb")]
        diff = small(r["max_abs_diff_log_kvzip_plus"], 1)
        rows.append([context, *speeds, times(r["ours_time_vs_plain"]), *peaks, diff])
    return rows


def eviction_rows() -> list[list[str]]:
    keys = ("compression_ratio", "bytes_vs_full", "bytes_vs_masking", "decode_ms_vs_full", "decode_ms_vs_masking")
    return [[str(r["context_tokens"]), *(f"{r[k]:.2f}" for k in keys)] for r in rec("cpu/eviction_demo.json")]


def pruned_to(r: dict) -> str:
    return f"{r['context_tokens'] // 1024}k pruned to {r['compression_ratio']:.2f}"


def attention_rows() -> list[list[str]]:
    """Paper geometry (queries, decode, chunked prefill) and the demo model's decode from eviction_demo.json."""
    queries, decode = rec("cpu/queries_paper.json"), rec("cpu/decode_paper.json")
    prefill = rec("cpu/prefill_paper_16k.json")[0]
    evictions = {(r["context_tokens"], r["target_ratio"]): r for r in rec("cpu/eviction_demo.json")}
    demo = [evictions[key] for key in ((2048, 0.5), (2048, 0.75), (8192, 0.75))]
    ratios = joined((q["compression_ratio"] for q in queries), 2)
    steps = " / ".join(map(pruned_to, decode))
    compiled = rec("cpu/decode_paper_compiled.json")
    cells = " · ".join(map(pruned_to, compiled))
    return [
        [
            f"{queries[0]['query_tokens']}-token forward over {queries[0]['context_tokens'] // 1024}k tokens pruned to "
            f"{ratios}: extra peak memory",
            joined((q["peak_mb_vs_full"] for q in queries), 3),
        ],
        ["the same: time", joined((q["ms_vs_full"] for q in queries), 2)],
        [
            "the same through the decoding kernel (what a compiled chunk step runs; eager CPU chunks run flash): time",
            joined((q["ms_vs_full"] for q in rec("cpu/queries_paper_decode_kernel.json")), 2),
        ],
        [f"one-token decode step, one layer, at {steps}: time", joined((d["ms_vs_full"] for d in decode), 2)],
        [
            f"the same at {cells}: time eager / compiled (torch.compile, both caches)",
            " · ".join(f"{d['ms_vs_full']:.2f} / {d['compiled_ms_vs_full']:.2f}" for d in compiled),
        ],
        [
            "pruned logits vs masking's (the same entries dropped), largest difference, float32",
            small(max(r["logits_max_diff_vs_masking"] for r in queries + compiled), 0),
        ],
        [
            f"chunked prefill of {prefill['context_tokens'] // 1024}k tokens in {prefill['chunk_tokens'] // 1024}k "
            f"chunks (removed {prefill['compression_ratio']:.2f}) vs whole-prompt prefill: peak / time",
            joined([prefill["prefill_peak_mb_vs_full"], prefill["prefill_ms_vs_full"]], 2),
        ],
        [
            "demo model, decode at 2k pruned to "
            f"{demo[0]['compression_ratio']:.2f} / {demo[1]['compression_ratio']:.2f} / 8k pruned to "
            f"{demo[2]['compression_ratio']:.2f} (`eviction.py`): time",
            joined((d["decode_ms_vs_full"] for d in demo), 2),
        ],
    ]


def _target(r: dict, key: str, verbose: bool) -> str:
    """A KVzap row's gain against its target: met, or missed (for the batch: by how many rows of the budget)."""
    target = r["targets"][key]
    if r[key] >= target:
        verdict = "met"
    elif key == "max_batch_vs_full":
        short = math.ceil(target * r["budget_rows"]) - r["batch"]
        verdict = f"missed by {'a row' if short == 1 else f'{short} rows'}"
    else:
        verdict = "missed"
    return f" (target {num(target, 1)}×: {verdict})" if verbose else f" ({verdict})"


def serving_rows() -> list[list[str]]:
    """1,024-token prompts (serving.json), then 2,048 (serving_2k.json): full cache and KVzap at two targets."""
    rows = []
    for name, verbose in (("cpu/serving.json", True), ("cpu/serving_2k.json", False)):
        for r in rec(name):
            prefix = "" if r["prompt_tokens"] == 1024 else f"{r['prompt_tokens']:,}-token prompts: "
            if r["target_ratio"]:
                label = f"KVzap, τ for r ≈ {r['target_ratio']:g}" if verbose else f"KVzap, r ≈ {r['target_ratio']:g}"
                cells = [
                    f"{r['compression_ratio']:.3f}",
                    str(r["batch"]),
                    times(r["max_batch_vs_full"]) + _target(r, "max_batch_vs_full", verbose),
                    f"{r['bytes_per_row_vs_full']:.3f}",
                    times(r["tokens_per_s_vs_full"]) + _target(r, "tokens_per_s_vs_full", verbose),
                ]
            else:
                label = "full cache"
                cells = ["0", str(r["batch"]), times(1), "1.00", times(1)]
            if prefix and not r["target_ratio"]:
                prefix = f"{r['prompt_tokens']:,}-token prompts (`{Path(name).name}`): "
            rows.append([prefix + label, *cells])
    return rows


def aime_rows() -> list[list[str]]:
    """Batch 1 against batch 4; a greedy row's identical answers, and its largest per-row ratio gap where not 0."""
    labels = {
        ("full", "greedy"): "full cache, greedy",
        ("full", "sampled"): "full cache, sampled (AIME's settings)",
        ("kvzap", "sampled"): "KVzap, sampled",
    }
    rows = []
    for r in rec("cpu/aime_batching.json")["records"]:
        greedy = r["sampling"] == "greedy"
        label = labels.get((r["method"], r["sampling"]))
        if label is None:
            label = f"KVzap (decoding, r = {r['compression_ratio']:.2f}), greedy"
        identical = f"{r['identical_answers']} / {r['rollouts']}"
        if r["max_ratio_gap"]:
            identical += f" (ratios equal to {small(r['max_ratio_gap'], 0)})"
        rows.append(
            [
                label,
                f"{r['batch_1_s']:.1f} s",
                f"{r['batched_s']:.1f} s",
                times(r["speedup"]),
                identical if greedy else "–",
            ]
        )
    return rows


def h200_rows() -> list[list[str]]:
    by_context: dict[int, list[dict]] = {}
    for r in rec("h200/gpu_decode.json"):
        by_context.setdefault(r["context_tokens"], []).append(r)
    peak = lambda r: r["prefill_peak_bytes"]["eviction"] / r["prefill_peak_bytes"]["full"]  # noqa: E731
    return [
        [
            f"{context:,}",
            joined((r["compression_ratio"] for r in runs), 2),
            joined((r["kv_bytes_vs_full"] for r in runs), 3),
            joined((peak(r) for r in runs), 2),
        ]
        for context, runs in by_context.items()
    ]


def slot_fill_rows() -> list[list[str]]:
    keys = ("kvzap_ratio", "per_layer_fill_ratio", "all_layers_fill_ratio")
    return [
        [r["mode"], num(r["threshold"]), *(f"{r[k]:.3f}" for k in keys), f"{r['max_over_mean']:.2f}"]
        for r in rec("cpu/slot_fill.json")["records"]
    ]


# --- plugins/vllm/README.md ---------------------------------------------------------------------------------------

SURROGATES = {"linear": "Linear", "mlp": "MLP"}
SLOT_KEYS = ("kvzap_ratio", "per_layer_fill_ratio", "all_layers_fill_ratio")


def step_0_rows() -> list[list[str]]:
    """What each layout would free, per τ (prefill, then decoding), and the sequences that lets a memory hold."""
    records = rec("cpu/slot_fill.json")["records"] + rec("cpu/slot_fill_high.json")["records"]
    return [
        [
            num(r["threshold"]),
            r["mode"],
            *(f"{r[k]:.3f}" for k in SLOT_KEYS),
            " / ".join(times(1 / (1 - r[k])) for k in SLOT_KEYS),
        ]
        for r in sorted(records, key=lambda r: (r["threshold"], r["mode"] != "prefill"))
    ]


def engine_accuracy_rows(name: str) -> list[list[str]]:
    """Dense vLLM, then the plugin at each τ of each surrogate (`vllm_accuracy.py`; named per head or judging chunks
    where it does)."""
    record = rec(name)
    per_head, chunks = record.get("layout") == "per_head", record.get("judge_chunks", False)
    setting = ", ".join(label for label, on in (("per head", per_head), ("chunks", chunks)) if on)
    suffix = f" ({setting})" if setting else ""
    rows = []
    for r in record["records"]:
        score = score_ci(r["score"], *r["score_ci"])
        if r["threshold"] is None:
            rows.append([r["surrogate"], "–", score, "–", "–", "–"])
            continue
        ratios = f"{r['fill_ratio']:.3f}", f"{r['kvzap_ratio']:.3f}"
        engine = f"vLLM + KVzap-{SURROGATES[r['surrogate']]}{suffix}"
        rows.append([engine, num(r["threshold"]), score, *ratios, "yes" if r["inside_dense_interval"] else "no"])
    return rows


def engine_serving_rows(name: str) -> list[list[str]]:
    """Each engine of a `vllm_serving.py` record (times in s, per-token times in ms)."""
    return [
        [
            r["engine"],
            score_ci(r["score"], *r["score_ci"]),
            f"{r['mean_running']:.2f} / {r['peak_running']}",
            str(r["preemptions"]),
            f"{r['output_tokens_per_s']:.1f}",
            f"{r['ttft_p50_s']:.1f} / {r['ttft_p95_s']:.1f}",
            f"{1e3 * r['tpot_p50_s']:.0f} / {1e3 * r['tpot_p95_s']:.0f}",
            f"{1e3 * r['alone_tpot_s']:.1f}, {1e3 * r['alone_step_p95_s']:.1f}",
            times(r["realised_compression"]),
            r["same_tokens_as_transformers"],
            "–" if r["blocks_leaked"] is None else str(r["blocks_leaked"]),
        ]
        for r in rec(name)["records"]
    ]


ENGINE_ACCURACY = ("engine", "τ", "score [95 %]", "fill ratio (per layer)", "KVzap ratio (per head)")
ENGINE_ACCURACY += ("inside dense interval",)
ENGINE_SERVING = ("engine", "score [95 %]", "running: mean / peak", "preemptions", "output tokens/s")
ENGINE_SERVING += ("TTFT p50 / p95 (s)", "TPOT p50 / p95 (ms)", "alone: TPOT, step p95 (ms)", "realised compression")
ENGINE_SERVING += ("tokens as transformers", "blocks leaked")
SERVING_RECORDS = ("decode", "decode_per_head", "decode_per_head_matched")
SERVING_RECORDS += ("prefill", "prefill_chunks", "prefill_chunks_mild")
ACCURACY_RECORDS = ("vllm_accuracy", "vllm_accuracy_per_head", "vllm_accuracy_chunks")


PAPER_SMALL = "cpu/paper_small.json"


def paper_small_cell_rows() -> list[list[str]]:
    """config/paper_small.yaml's cells, averaged over the tasks: entry, method, τ or ratio asked, ratio measured."""
    from kvzap.evaluation.methods import METHODS  # here: rendering the other tables needs no kvzap

    rows = []
    for c in rec(PAPER_SMALL)["cells"]:
        if c["task"] == "average":
            value = "" if c["value"] is None else f"{c['value']:g}".replace("-", "−")
            name = METHODS[c["method"]].label
            score = score_ci(c["score"], c["ci_low"], c["ci_high"])
            rows.append([c["benchmark"], name, value, num(c["ratio"], 2), score, str(c["n_samples"])])
    return rows


def paper_small_claim_rows() -> list[list[str]]:
    claims = rec(PAPER_SMALL)["claims"]
    return [[c["claim"], c["paper"], c["measured"], f"**{c['verdict']}**", c["why"]] for c in claims]


RECIPES = "cpu/recipe_comparison.json"
RECIPE_NAMES = {"smollm2-135m": "paper", "smollm2-135m-demo-recipe": "demo"}


def r2_ci(fit: dict) -> str:
    return f"{num(fit['r2'], 3)} [{num(fit['ci'][0], 3)}, {num(fit['ci'][1], 3)}]"


def recipe_rows() -> list[list[str]]:
    """Each recipe's surrogates on each recipe's held-out text and on the evaluation's 4k contexts."""
    rows = []
    for r in rec(RECIPES)["r2"]:
        on = r["on"]
        for model, name in RECIPE_NAMES.items():
            on = on.replace(f"{model} held-out", f"{name} recipe's held-out prompts")
        rows.append([RECIPE_NAMES[r["recipe"]], r["surrogate"], on, r2_ci(r)])
    return rows


RECIPES_2K = "cpu/recipes_2k.json"


def two_k_rows() -> list[list[str]]:
    """Each recipe's Linear, its MLP's three seeds together and each seed alone at 2k: score, paired differences
    with the full cache and (an MLP) with its recipe's Linear at the nearest ratio, and R² on the 2k contexts."""
    record = rec(RECIPES_2K)
    fits = {(r["recipe"], r["surrogate"]): r for r in record["r2"] if "ruler-2k contexts" in r["on"]}

    def paired(d: dict | None) -> str:
        return f"{signed(d['difference'])} [{signed(d['ci'][0])}, {signed(d['ci'][1])}]" if d else ""

    rows = []
    for a in record["accuracy"]:
        if a["method"] == "kvzap_linear":
            name = "linear"
        else:
            name = "mlp, 3 seeds" if a["seed"] is None else f"mlp {a['seed']}"
        fit = fits.get((a["recipe"], name))  # none for the seeds together: each seed has its own fit
        r2 = r2_ci(fit) if fit else ""
        rows.append(
            [RECIPE_NAMES[a["recipe"]], name, num(float(a["value"])), num(a["ratio"], 2), num(a["score"])]
            + [str(a["n_samples"]), paired(a.get("vs_full")), paired(a.get("vs_linear")), r2]
        )
    return rows


# --- the tables ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Table:
    doc: str  # the file, from the repository root
    marker: str  # the text the table follows (its first table after it)
    header: tuple[str, ...]
    rows: Callable[[], list[list[str]]]

    def render(self) -> str:
        lines = [list(self.header), ["---"] * len(self.header), *self.rows()]
        return "".join("|" + "|".join(f" {c} " if c else " " for c in cells) + "|\n" for cells in lines)

    def printed(self, text: str) -> re.Match:
        """The table as the doc prints it: the first block of table lines after the marker."""
        start = text.index(self.marker) + len(self.marker)
        found = BLOCK.search(text, start)
        if found is None:
            raise ValueError(f"{self.doc}: no table after {self.marker!r}")
        return found


TABLES = {
    "demo-dtypes": Table(
        RESULTS, "## The demo in float32 and bfloat16", ("", "AVX2 kernels, float32", "AMX, bfloat16"), demo_dtype_rows
    ),
    "more-data": Table(
        RESULTS, "## Twice the oracle data", ("method", "τ", "compression ratio", "score [95 %]"), more_data_rows
    ),
    "oracle-ceiling": Table(
        RESULTS,
        "## What limits the 0.6 point",
        ("scores", "τ", "compression ratio", "RULER-style niah_single_2 [95 %]"),
        oracle_ceiling_rows,
    ),
    "training-pairs": Table(
        RESULTS,
        "## Which training data the surrogates need",
        ("sources", "pairs", "surrogate", "held-out R²", "R² (benchmark)", "τ at 0.6", "accuracy at 0.6 [95 %]"),
        training_pairs_rows,
    ),
    "essays": Table(
        RESULTS,
        "### Held-out essays at 2k tokens",
        ("surrogate", "τ", "ratio, bfloat16", "score, bfloat16", "ratio, float32 (AVX2)", "score, float32 (AVX2)"),
        essay_rows,
    ),
    "science": Table(
        RESULTS,
        "### What moves KVzap-MLP against KVzap-Linear",
        ("rows", "score dtype", "oracle data", "MLP training", "KVzap-MLP, mean of 3 seeds", "KVzap-Linear")
        + ("MLP − Linear",),
        science_rows,
    ),
    "paper-small-claims": Table(
        RESULTS,
        "### Each claim's verdict",
        ("claim", "paper", "measured: difference in points [95 %] (paired rows)", "verdict", "why"),
        paper_small_claim_rows,
    ),
    "paper-small-cells": Table(
        RESULTS,
        "### Every cell, averaged over the 8 tasks",
        ("entry", "method", "τ or ratio asked", "ratio", "score [95 %]", "rows"),
        paper_small_cell_rows,
    ),
    "recipes": Table(
        RESULTS, "### The demo's recipe against the paper's", ("recipe", "surrogate", "R² on", "R² [95 %]"), recipe_rows
    ),
    "two-k": Table(
        RESULTS,
        "### The 2k question (`make paper-small-2k`)",
        ("recipe", "surrogate", "τ", "ratio", "score", "rows", "− full cache [95 %]", "MLP − Linear [95 %]")
        + ("R² on 2k contexts [95 %]",),
        two_k_rows,
    ),
    "oracle": Table(
        BENCHMARKS,
        "The oracle against kvpress's collection",
        ("oracle, context", "ours tok/s", "kvpress-collection tok/s", "plain forward tok/s")
        + ("ours' time / plain forward's", "ours peak MB", "kvpress-collection peak MB", "plain peak MB")
        + ("max abs diff (log)",),
        oracle_rows,
    ),
    "eviction": Table(
        BENCHMARKS,
        "Physical eviction",
        ("eviction, context", "ratio", "bytes vs full", "bytes vs masking", "decode time vs full")
        + ("decode time vs masking",),
        eviction_rows,
    ),
    "attention": Table(
        BENCHMARKS,
        "## Pruned attention and chunked prefill",
        ("measurement (paper geometry unless said)", "pruned / dense"),
        attention_rows,
    ),
    "serving": Table(
        BENCHMARKS,
        "## Batched generation",
        ("serving at equal KV memory (5 full rows)", "removed", "batch", "batch vs full", "KV bytes per row vs full")
        + ("tokens/s vs full",),
        serving_rows,
    ),
    "aime": Table(
        BENCHMARKS,
        "its second thread.",  # the first table after the serving prose
        ("AIME protocol, 2 problems × 4 rollouts, 32 new tokens", "batch 1", "batch 4", "speedup")
        + ("identical greedy answers",),
        aime_rows,
    ),
    "h200": Table(
        BENCHMARKS,
        "## On one GPU (H200)",
        ("context", "removed", "KV held, eviction vs full", "prefill peak (above weights), eviction vs full"),
        h200_rows,
    ),
    "slot-fill": Table(
        BENCHMARKS,
        "## What a per-token-slot engine can free",
        ("mode", "τ", "KVzap's compression", "per-layer slots (max over heads)", "one table for all layers")
        + ("max / mean kept, mean over layers",),
        slot_fill_rows,
    ),
    "vllm-step-0": Table(
        PLUGIN,
        "ignoring block\nrounding:",
        ("τ", "mode", "KVzap ratio (per head)", "per-layer fill ratio", "one table for all layers")
        + ("sequences: per head / per layer / one table",),
        step_0_rows,
    ),
    **{
        name.replace("_", "-"): Table(
            PLUGIN, f"`benchmarks/cpu/{name}.json`", ENGINE_ACCURACY, partial(engine_accuracy_rows, f"cpu/{name}.json")
        )
        for name in ACCURACY_RECORDS
    },
    **{
        f"vllm-serving-{name.replace('_', '-')}": Table(
            PLUGIN,
            f"`benchmarks/cpu/vllm_serving_{name}.json`",
            ENGINE_SERVING,
            partial(engine_serving_rows, f"cpu/vllm_serving_{name}.json"),
        )
        for name in SERVING_RECORDS
    },
}


def fix() -> list[str]:
    """Rewrite every table from its record; returns the names of those that changed."""
    changed = []
    for name, spec in TABLES.items():
        path = ROOT / spec.doc
        text = path.read_text(encoding="utf-8")
        found = spec.printed(text)
        rendered = spec.render()
        if found.group(0) != rendered:
            path.write_text(text[: found.start()] + rendered + text[found.end() :], encoding="utf-8")
            changed.append(name)
    return changed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fix", action="store_true", help="rewrite each doc's table from its record")
    args = parser.parse_args()
    if args.fix:
        print("rewritten:", ", ".join(fix()) or "none")
        return
    for name, spec in TABLES.items():
        print(f"{name} ({spec.doc}):\n{spec.render()}")


if __name__ == "__main__":
    main()
