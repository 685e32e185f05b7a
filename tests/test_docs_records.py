"""The numbers in docs/ and benchmarks/README.md are their records' numbers: every table built from a committed JSON
record is read back cell by cell, the prose's headline numbers are checked one claim at a time, and the cost
forecast's table is rerun with its own command (a doc edited by hand, or a record replaced, fails here).

A printed number matches a value when the value rounds to it at the printed precision ("0.540" is 0.5395-0.5405)."""

from __future__ import annotations

import functools
import json
import math
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from kvzap.evaluation import methods
from kvzap.report.flops import LayerShape, share

ROOT = Path(__file__).resolve().parents[1]
# A number as the docs print it: "−2.6", "5,046", "0.540", "2.4e-5"; not the digits inside "Qwen3-8B", "16k",
# "float32" or "7.5k".
NUMBER = re.compile(r"(?<![\w.,\-−])[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:e-\d+)?(?![\w.]*\w)")


@functools.cache
def doc(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


@functools.cache
def rec(name: str):
    """A committed record, by its path under benchmarks/."""
    return json.loads((ROOT / "benchmarks" / name).read_text())


def flat(text: str) -> str:
    """Whitespace collapsed, so a quoted claim matches across the doc's line wraps."""
    return " ".join(text.split())


def numbers(text: str) -> list[str]:
    return [n.replace("−", "-").replace(",", "") for n in NUMBER.findall(text)]


def rounds_to(printed: str, value) -> bool:
    """Whether `value` (or every value of a tuple) rounds to `printed` at its printed precision."""
    if isinstance(value, tuple):
        return all(rounds_to(printed, v) for v in value)
    half_unit = Decimal(5).scaleb(Decimal(printed).as_tuple().exponent - 1)
    return abs(Decimal(printed) - Decimal(repr(float(value)))) <= half_unit


def mismatches(printed: list[str], values: list) -> list[str]:
    """The printed numbers that are not their values, and a count that differs."""
    if len(printed) < len(values):
        return [f"{len(printed)} numbers printed ({printed}), {len(values)} recorded ({values})"]
    return [f"{p} is not {v}" for p, v in zip(printed, values) if not rounds_to(p, v)]


def table(text: str, marker: str) -> list[list[str]]:
    """The cells of the first Markdown table after `marker`, header and rule rows dropped."""
    block = re.search(r"((?:^ *\|.*\|\n)+)", text.split(marker, 1)[1], re.MULTILINE).group(1)
    rows = [[cell.strip().strip("*") for cell in line.strip().strip("|").split("|")] for line in block.splitlines()]
    return rows[2:]


def row_mismatches(rows: list[list[str]], expected: list[list]) -> list[str]:
    """Each cell against its expectation: None skips a cell, a string is its text, a list its leading numbers."""
    found = [] if len(rows) == len(expected) else [f"{len(rows)} rows printed, {len(expected)} recorded"]
    for i, (row, want) in enumerate(zip(rows, expected), 1):
        for j, (cell, value) in enumerate(zip(row, want), 1):
            if isinstance(value, str):
                found += [] if cell.lower() == value.lower() else [f"row {i} cell {j}: {cell!r} is not {value!r}"]
            elif value is not None:
                found += [f"row {i} cell {j}: {m}" for m in mismatches(numbers(cell)[: len(value)], value)]
    return found


def cell(record: dict, method: str, value=None) -> dict:
    """One evaluated cell of a demo record (the full cache has no value)."""
    return next(c for c in record["cells"] if c["method"] == method and (value is None or c["value"] == value))


def score(c: dict) -> list[float]:
    return [c["average"], c["ci_low:average"], c["ci_high:average"]]


def label(method: str) -> str:
    return methods.METHODS[method].label


# --- docs/results.md -------------------------------------------------------------------------------------------


def demo_dtype_rows() -> list[list]:
    """The float32 (AVX2 kernels) and bfloat16 (AMX) demo runs side by side; the τ labels' ratios hold for both."""
    a, b = rec("cpu/demo_run_avx2.json"), rec("cpu/demo_run_amx.json")
    stages = ("prepare", "oracle", "surrogates", "evaluation")
    rows = [
        [None, [a["install_s"]], [b["install_s"]]],
        [None, [a["stage_s"][s] for s in stages], [b["stage_s"][s] for s in stages]],
        [None, [a["total_s"]], [b["total_s"]]],
        [None, [s["r2_mean"] for s in a["surrogates"]], [s["r2_mean"] for s in b["surrogates"]]],
    ]
    for method in ("kvzap_linear", "kvzap_mlp"):
        taus = (-2.6, -1.6, -1.0)
        ratios = [(cell(a, method, t)["compression_ratio"], cell(b, method, t)["compression_ratio"]) for t in taus]
        rows.append(
            [
                [x for t, r in zip(taus, ratios) for x in (t, r)],
                [cell(a, method, t)["average"] for t in taus],
                [cell(b, method, t)["average"] for t in taus],
            ]
        )
    baselines = (("full", None), ("kvzip", 0.6), ("streaming_llm", 0.6), ("knorm", 0.6))
    rows.append([[0.6] * 3, *([cell(run, m, v)["average"] for m, v in baselines] for run in (a, b))])
    return rows


def more_data_rows() -> list[list]:
    """The demo with twice the oracle data (one run)."""
    run = rec("cpu/demo_more_data.json")
    rows = [[label("full"), [], [0], score(cell(run, "full"))]]
    for method, tau in [("kvzap_mlp", t) for t in (-2.6, -1.6, -1.0)] + [("kvzap_linear", t) for t in (-2.6, -1.6)]:
        c = cell(run, method, tau)
        rows.append([label(method), [tau], [c["compression_ratio"]], score(c)])
    streaming, knorm = cell(run, "streaming_llm", 0.6), cell(run, "knorm", 0.6)
    ratios = (streaming["compression_ratio"], knorm["compression_ratio"])
    return rows + [["StreamingLLM / Knorm", [0.6], [ratios], [streaming["average"], knorm["average"]]]]


def oracle_ceiling_rows() -> list[list]:
    return [
        [r["scores"], [r["threshold"]], [r["compression_ratio"]], [r["average"], *r["average_ci"]]]
        for r in rec("cpu/oracle_ceiling_demo.json")
    ]


def training_pairs_rows() -> list[list]:
    """Both surrogates against their training pairs; the essays-only rows have no benchmark R² (NaN, printed –)."""
    return [
        [
            r["sources"],
            [r["n_pairs"]],
            label(f"kvzap_{r['kind']}").removeprefix("KVzap-"),
            [r["r2_mean"]],
            "–" if math.isnan(r["r2_benchmark"]) else [r["r2_benchmark"]],
            [r["threshold"]],
            [r["average"], *r["average_ci"]],
        ]
        for r in rec("cpu/training_pairs.json")["rows"]
    ]


# --- benchmarks/README.md ---------------------------------------------------------------------------------------


def oracle_rows() -> list[list]:
    keys = ("ours_tokens_per_s", "ref_tokens_per_s", "plain_tokens_per_s", "ours_time_vs_plain")
    keys += ("ours_peak_mb", "ref_peak_mb", "plain_peak_mb", "max_abs_diff_log_kvzip_plus")
    return [[[r["context_tokens"]], *([r[k]] for k in keys)] for r in rec("cpu/oracle_demo.json")]


def eviction_rows() -> list[list]:
    keys = ("context_tokens", "compression_ratio", "bytes_vs_full", "bytes_vs_masking")
    keys += ("decode_ms_vs_full", "decode_ms_vs_masking")
    return [[[r[k]] for k in keys] for r in rec("cpu/eviction_demo.json")]


def attention_rows() -> list[list]:
    """Paper geometry (queries, decode, chunked prefill) and the demo model's decode from eviction_demo.json."""
    queries, decode = rec("cpu/queries_paper.json"), rec("cpu/decode_paper.json")
    prefill = rec("cpu/prefill_paper_16k.json")[0]
    evictions = {(r["context_tokens"], r["target_ratio"]): r for r in rec("cpu/eviction_demo.json")}
    demo = [evictions[key] for key in ((2048, 0.5), (2048, 0.75), (8192, 0.75))]
    return [
        [
            [queries[0]["query_tokens"], *(q["compression_ratio"] for q in queries)],
            [q["peak_mb_vs_full"] for q in queries],
        ],
        [[], [q["ms_vs_full"] for q in queries]],
        [[d["compression_ratio"] for d in decode], [d["ms_vs_full"] for d in decode]],
        [[prefill["compression_ratio"]], [prefill["prefill_peak_mb_vs_full"], prefill["prefill_ms_vs_full"]]],
        [[d["compression_ratio"] for d in demo], [d["decode_ms_vs_full"] for d in demo]],
    ]


def serving_rows() -> list[list]:
    keys = ("compression_ratio", "batch", "max_batch_vs_full", "bytes_per_row_vs_full", "tokens_per_s_vs_full")
    runs = rec("cpu/serving.json") + rec("cpu/serving_2k.json")
    # the label names a prompt length other than 1,024 tokens and the target ratio
    labels = [
        [r["prompt_tokens"]] * (r["prompt_tokens"] != 1024) + [r["target_ratio"]] * bool(r["target_ratio"])
        for r in runs
    ]
    return [[names, *([r[k]] for k in keys)] for names, r in zip(labels, runs)]


def aime_rows() -> list[list]:
    """Batch 1 against batch 4; a greedy row's identical answers, and its largest per-row ratio gap where not 0."""
    rows = []
    for r in rec("cpu/aime_batching.json")["records"]:
        greedy = r["sampling"] == "greedy"
        identical = [r["identical_answers"], r["rollouts"]] + ([r["max_ratio_gap"]] if r["max_ratio_gap"] else [])
        rows.append(
            [
                [r["compression_ratio"]] if r["method"] == "kvzap" and greedy else None,
                [r["batch_1_s"]],
                [r["batched_s"]],
                [r["speedup"]],
                identical if greedy else "–",
            ]
        )
    return rows


def prefill_peak(r: dict) -> float:
    return r["prefill_peak_bytes"]["eviction"] / r["prefill_peak_bytes"]["full"]


def h200_rows() -> list[list]:
    by_context: dict[int, list[dict]] = {}
    for r in rec("h200/gpu_decode.json"):
        by_context.setdefault(r["context_tokens"], []).append(r)
    return [
        [
            [context],
            [r["compression_ratio"] for r in runs],
            [r["kv_bytes_vs_full"] for r in runs],
            [prefill_peak(r) for r in runs],
        ]
        for context, runs in by_context.items()
    ]


def slot_fill_rows() -> list[list]:
    keys = ("threshold", "kvzap_ratio", "per_layer_fill_ratio", "all_layers_fill_ratio", "max_over_mean")
    return [[r["mode"], *([r[k]] for k in keys)] for r in rec("cpu/slot_fill.json")["records"]]


def essay_rows() -> list[list]:
    """The demo's surrogates on held-out 2k-token essays, the bfloat16 run beside the AVX2 one: each machine's ratio,
    then its score (for KVzap-MLP: the mean over seeds, then each seed's)."""
    runs = [rec("cpu/essay_check_bf16.json")["cells"], rec("cpu/essay_check_avx2.json")["cells"]]

    def machine_cells(cells: list[dict], kind: str, tau) -> list:
        chosen = [c for c in cells if c["kind"] == kind and c["threshold"] == tau]
        scores = [c["score"] for c in chosen]
        return [[chosen[0]["ratio"]], [sum(scores) / len(scores), *scores] if kind == "mlp" else scores]

    keys = [("full", None)] + [(kind, tau) for kind in ("linear", "mlp") for tau in (-2.6, -1.6, -1.0)]
    return [
        [None, None if tau is None else [tau], *(x for c in runs for x in machine_cells(c, kind, tau))]
        for kind, tau in keys
    ]


def science_rows() -> list[list]:
    """Each candidate's cells in benchmarks/demo_science.py's record: MLP mean over seeds, Linear, MLP - Linear."""
    effects = rec("cpu/demo_science.json")["effects"]
    keys = sorted({(e["rows"], e["score_dtype"], e["data"], e["setting"]) for e in effects}, key=science_order)
    rows = []
    for key in keys:
        by_tau = {e["threshold"]: e for e in effects if (e["rows"], e["score_dtype"], e["data"], e["setting"]) == key}
        taus = sorted(by_tau)
        rows.append([*key, *([by_tau[t][field] for t in taus] for field in ("mlp_mean", "linear", "mlp_minus_linear"))])
    return rows


def science_order(key: tuple) -> tuple:
    """The reference cell first, then one change from it at a time."""
    rows, score_dtype, data, setting = key
    return (rows != "demo", score_dtype != "float32", data != "bf16x2", setting != "paper", key)


RESULTS, BENCHMARKS, PIPELINE = "docs/results.md", "benchmarks/README.md", "docs/pipeline.md"
TABLES = {  # id: (doc, the text just before the table, the record's rows)
    "demo-dtypes": (RESULTS, "## The demo in float32 and bfloat16", demo_dtype_rows),
    "more-data": (RESULTS, "## Twice the oracle data", more_data_rows),
    "oracle-ceiling": (RESULTS, "## What limits the 0.6 point", oracle_ceiling_rows),
    "training-pairs": (RESULTS, "## Which training data the surrogates need", training_pairs_rows),
    "oracle": (BENCHMARKS, "The oracle against kvpress's collection", oracle_rows),
    "eviction": (BENCHMARKS, "Physical eviction", eviction_rows),
    "attention": (BENCHMARKS, "## Pruned attention and chunked prefill", attention_rows),
    "serving": (BENCHMARKS, "## Batched generation", serving_rows),
    "aime": (BENCHMARKS, "its second thread.", aime_rows),  # the first table after the serving prose
    "h200": (BENCHMARKS, "## On one GPU (H200)", h200_rows),
    "slot-fill": (BENCHMARKS, "## What a per-token-slot engine can free", slot_fill_rows),
    "essays": (RESULTS, "### Held-out essays at 2k tokens", essay_rows),
    "science": (RESULTS, "### What moves KVzap-MLP against KVzap-Linear", science_rows),
}


@pytest.mark.parametrize("name", TABLES)
def test_table_is_its_record(name):
    path, marker, expected = TABLES[name]
    assert row_mismatches(table(doc(path), marker), expected()) == []


# --- prose: (doc, the claim as printed, the recorded values of its numbers in order) ------------------------------

AMX, AVX2, MORE = rec("cpu/demo_run_amx.json"), rec("cpu/demo_run_avx2.json"), rec("cpu/demo_more_data.json")
DTYPES, PAIRS = rec("cpu/demo_dtypes.json"), rec("cpu/training_pairs.json")
CEILING = {r["threshold"]: r for r in rec("cpu/oracle_ceiling_demo.json")}
TRAINED = {(r["sources"], r["n_pairs"], r["kind"]): r for r in PAIRS["rows"]}
MIX = [r for r in PAIRS["rows"] if r["sources"] == "all"]
CHUNKED = {r["prefill"]: r for r in rec("cpu/chunked_accuracy_demo.json")}
SERVING = {r["method"]: r for r in rec("cpu/serving.json")}
SERVING_2K = {r["method"]: r for r in rec("cpu/serving_2k.json")}
ROWS_10 = {r["method"]: r for r in rec("cpu/serving_10rows.json")}
QUIET = {r["method"]: r for r in rec("cpu/serving_10rows_quiet.json")}
REHEARSAL = {(r["method"], r["sampling"]): r for r in rec("cpu/aime_batching_rehearsal.json")["records"]}
GPU = rec("h200/gpu_decode.json")
GPU_FLOAT32 = rec("h200/gpu_decode_8k_float32.json")
GPU_8K = rec("h200/gpu_decode_8k_bfloat16.json")[0]
H200_ATTENTION = rec("h200/attention.json")
SLOTS = rec("cpu/slot_fill.json")["records"]
SWEEP, BATCHED = rec("cpu/shared_sweep_demo.json"), rec("cpu/shared_sweep_batched.json")
R05, R075 = "kvzap r~0.5", "kvzap r~0.75"


def overhead_shapes() -> dict[str, LayerShape]:
    """The paper models' layer shapes as benchmarks/overhead.py holds them, and SmolLM2-135M's config.json."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import overhead
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return {**overhead.CONFIGS, "SmolLM2-135M": LayerShape(H_Q=9, H=3, D=64, D_h=576, D_int=1536)}


def shares(model: str) -> list[float]:
    shape = overhead_shapes()[model]
    return [100 * share(shape, "mlp"), 100 * share(shape, "linear")]


def uneven_layers() -> list[float]:
    """Layers 7 and 18's max / mean kept, over every record."""
    return [r["max_over_mean_by_layer"][layer] for r in SLOTS for layer in (7, 18)]


PROSE = [
    (
        RESULTS,
        "Pearson r = 0.9998 (5,046 pairs",
        [DTYPES["oracle"]["pearson_log_kvzip_plus"], DTYPES["oracle"]["pairs"]],
    ),
    (
        RESULTS,
        "absolute difference 0.030 nats, largest 0.95",
        [DTYPES["oracle"][k] for k in ("mean_abs_diff", "max_abs_diff")],
    ),
    (RESULTS, "the oracle (2.4× faster)", [AVX2["stage_s"]["oracle"] / AMX["stage_s"]["oracle"]]),
    (RESULTS, "the evaluation gains less (1.6×)", [AVX2["stage_s"]["evaluation"] / AMX["stage_s"]["evaluation"]]),
    (RESULTS, "95,536 training pairs", [MORE["surrogates"][0]["n_train_pairs"]]),
    (
        RESULTS,
        "R² Linear 0.646, MLP 0.718 (0.644 / 0.701 with 49,974 pairs)",
        [s["r2_mean"] for s in MORE["surrogates"] + AMX["surrogates"]] + [AMX["surrogates"][0]["n_train_pairs"]],
    ),
    (
        RESULTS,
        "about 200 s with AMX, 480 s on AVX2",
        [round(2 * AMX["stage_s"]["oracle"], -1), round(2 * AVX2["stage_s"]["oracle"], -1)],
    ),
    (
        RESULTS,
        "(τ from −1.0 to 0.0 moves the ratio by only 0.034)",
        [-1.0, 0.0, CEILING[0.0]["compression_ratio"] - CEILING[-1.0]["compression_ratio"]],
    ),
    (
        RESULTS,
        "KVzap-MLP reaches 93.3 at 0.602",
        [cell(MORE, "kvzap_mlp", -1.6)[k] for k in ("average", "compression_ratio")],
    ),
    (RESULTS, "full cache 56.7 [45.0, 68.3]", [PAIRS["full"]["average"], *PAIRS["full"]["average_ci"]]),
    (
        RESULTS,
        "(essays alone: 0.53 and 0.54; the mix: 0.64 → 0.68 for Linear, 0.66 → 0.74 for the MLP)",
        [
            *(TRAINED["essays", 7500, kind]["r2_mean"] for kind in ("linear", "mlp")),
            *(TRAINED["all", n, "linear"]["r2_mean"] for n in (7500, 66000)),
            *(TRAINED["all", n, "mlp"]["r2_mean"] for n in (7500, 66000)),
        ],
    ),
    (
        RESULTS,
        "(+0.02 at 7.5k, +0.07 at 66k)",
        [TRAINED["all", n, "mlp"]["r2_mean"] - TRAINED["all", n, "linear"]["r2_mean"] for n in (7500, 66000)],
    ),
    (RESULTS, "both fit at 0.42–0.46", [min(r["r2_benchmark"] for r in MIX), max(r["r2_benchmark"] for r in MIX)]),
    (
        RESULTS,
        "swings (51.7 / 28.3 / 65.0) while Linear's stays at 68–73",
        [r["average"] for r in MIX if r["kind"] == "mlp"]
        + [f(r["average"] for r in MIX if r["kind"] == "linear") for f in (min, max)],
    ),
    (
        RESULTS,
        "(it keeps epoch 9–15)",
        [f(r["best_epoch"] for r in PAIRS["rows"] if r["best_epoch"]) for f in (min, max)],
    ),
    (
        RESULTS,
        "At 66k pairs the gap is 8 points",
        [TRAINED["all", 66000, "linear"]["average"] - TRAINED["all", 66000, "mlp"]["average"]],
    ),
    (
        BENCHMARKS,
        "it takes 241 s in float32 on AVX2 kernels and 101 s",
        [AVX2["stage_s"]["oracle"], AMX["stage_s"]["oracle"]],
    ),
    (BENCHMARKS, "Qwen3-8B MLP 1.09 %, Linear 0.017 %", shares("Qwen/Qwen3-8B")),
    (BENCHMARKS, "Llama-3.1-8B 0.96 % / 0.015 %", shares("meta-llama/Llama-3.1-8B-Instruct")),
    (BENCHMARKS, "Qwen3-32B 0.67 % / 0.008 %", shares("Qwen/Qwen3-32B")),
    (BENCHMARKS, "SmolLM2-135M 1.18 % / 0.049 %", shares("SmolLM2-135M")),
    (
        BENCHMARKS,
        "(256-token chunks over 1k-token contexts, KVzap-MLP τ = −2.6, 60 samples)",
        [CHUNKED["chunk 256"][k] for k in ("chunk_tokens", "threshold", "n_samples")],
    ),
    (
        BENCHMARKS,
        "58.3 [46.7, 70.0] at compression 0.609 against 63.3 [53.3, 73.3] at 0.604 for the whole-prompt prefill, "
        "with 55 % of the answers identical",
        [
            *(
                v
                for p in ("chunk 256", "whole")
                for v in (CHUNKED[p]["average"], *CHUNKED[p]["average_ci"], CHUNKED[p]["compression_ratio"])
            ),
            100 * CHUNKED["chunk 256"]["same_answers_as_whole"],
        ],
    ),
    (BENCHMARKS, "shared the cores (682 ms per step)", [SERVING["full"]["decode_ms_per_step"]]),
    (
        BENCHMARKS,
        "removes 0.731–0.733, not 0.75",
        [SERVING[R075]["compression_ratio"], SERVING_2K[R075]["compression_ratio"], 0.75],
    ),
    (
        BENCHMARKS,
        "0.290 (1k prompts) or 0.283 (2k) of the full cache's bytes per row is room for 3.45× or 3.53× the rows, "
        "which a 5-row budget rounds down to 17 (3.40×)",
        [
            *(r[R075]["bytes_per_row_vs_full"] for r in (SERVING, SERVING_2K)),
            *(1 / r[R075]["bytes_per_row_vs_full"] for r in (SERVING, SERVING_2K)),
            SERVING["full"]["batch"],
            SERVING[R075]["batch"],
            SERVING[R075]["max_batch_vs_full"],
        ],
    ),
    (
        BENCHMARKS,
        "r 0.742 fits 35 rows, **3.50×** (met), at 2.03× the tokens/s (met); r 0.487 fits 18, 1.80× (met), at 1.38× "
        "the tokens/s (target 1.4×: missed in this noisy run; 1.72× and 2.65× in the runs above)",
        [
            *(ROWS_10[R075][k] for k in ("compression_ratio", "batch", "max_batch_vs_full", "tokens_per_s_vs_full")),
            *(ROWS_10[R05][k] for k in ("compression_ratio", "batch", "max_batch_vs_full", "tokens_per_s_vs_full")),
            1.4,
            SERVING_2K[R05]["tokens_per_s_vs_full"],
            SERVING[R05]["tokens_per_s_vs_full"],
        ],
    ),
    (
        BENCHMARKS,
        "r 0.487 fits 18 rows (1.80×) at 1.49× the tokens/s, r 0.742 fits 35 rows (3.50×) at 2.47× the tokens/s "
        "(full cache: 10 rows, 270 ms per step)",
        [
            *(
                v
                for m in (R05, R075)
                for v in (
                    QUIET[m][k] for k in ("compression_ratio", "batch", "max_batch_vs_full", "tokens_per_s_vs_full")
                )
            ),
            QUIET["full"]["batch"],
            QUIET["full"]["decode_ms_per_step"],
        ],
    ),
    (
        BENCHMARKS,
        "greedy 1.48 → 1.16 s (1.28×) for the full cache and 1.69 → 1.23 s (1.37×) for KVzap, 4 of 4 answers "
        "identical each and per-row ratios equal; sampled 1.06× and 1.12×",
        [
            *(
                v
                for m in ("full", "kvzap")
                for v in (REHEARSAL[m, "greedy"][k] for k in ("batch_1_s", "batched_s", "speedup"))
            ),
            REHEARSAL["kvzap", "greedy"]["identical_answers"],
            REHEARSAL["kvzap", "greedy"]["rollouts"],
            REHEARSAL["full", "sampled"]["speedup"],
            REHEARSAL["kvzap", "sampled"]["speedup"],
        ],
    ),
    (BENCHMARKS, "equal masking's to 3e-5 on CUDA", [max(r["max_abs_logit_diff_vs_masking"] for r in GPU_FLOAT32)]),
    (
        BENCHMARKS,
        "every method takes 57–103 ms per token",
        [min(min(r["decode_ms"].values()) for r in GPU), max(max(r["decode_ms"].values()) for r in GPU)],
    ),
    (
        BENCHMARKS,
        "(0.2× the dense extra peak for 512 queries over 16k tokens) but 12–15× the dense time",
        [
            tuple(r["peak_mb_vs_full"] for r in H200_ATTENTION),
            H200_ATTENTION[0]["query_tokens"],
            *(f(r["ms_vs_full"] for r in H200_ATTENTION) for f in (min, max)),
        ],
    ),
    (BENCHMARKS, "at most 0.006", [max(r["all_layers_fill_ratio"] for r in SLOTS)]),
    (
        BENCHMARKS,
        "realises 73–83 % of what KVzap frees (0.39–0.54 realised for 0.54–0.66 logical)",
        [
            *(f(100 * r["per_layer_fill_ratio"] / r["kvzap_ratio"] for r in SLOTS) for f in (min, max)),
            *(f(r["per_layer_fill_ratio"] for r in SLOTS) for f in (min, max)),
            *(f(r["kvzap_ratio"] for r in SLOTS) for f in (min, max)),
        ],
    ),
    (BENCHMARKS, "(max / mean 1.8–2.0)", [min(uneven_layers()), max(uneven_layers())]),
    (
        PIPELINE,
        "268 s per cell against 61 s shared (**4.4×**), with 60 of 60 greedy answers identical",
        [SWEEP["per_cell_s"], SWEEP["shared_s"], SWEEP["speedup"], SWEEP["identical_answers"], SWEEP["answers"]],
    ),
    (PIPELINE, "0.92× over one sample per decode", [BATCHED["batched_vs_shared"]]),
    (
        PIPELINE,
        "25,200 prefill tokens/s, 70 ms per decoding step",
        [round(GPU_8K["context_tokens"] / GPU_8K["prefill_s"]["full"], -2), GPU_8K["decode_ms"]["full"]],
    ),
]


@pytest.mark.parametrize(("path", "claim", "values"), PROSE, ids=[claim[:40] for _, claim, _ in PROSE])
def test_claim_is_its_record(path, claim, values):
    assert flat(claim) in flat(doc(path)), f"{path} no longer prints: {claim}"
    assert len(numbers(claim)) == len(values), "every number of a claim has its recorded value"
    assert mismatches(numbers(claim), values) == []


def test_slot_fill_names_the_most_uneven_layers():
    """Layers 7 and 18 are among the three most uneven at every threshold, as benchmarks/README.md says."""
    for r in SLOTS:
        by_layer = r["max_over_mean_by_layer"]
        assert {7, 18} <= set(sorted(range(len(by_layer)), key=by_layer.__getitem__)[-3:]), r["mode"]


def test_both_dtypes_print_the_same_ratios():
    """docs/results.md: "the compression ratio of every cell agrees to three decimals" between the two demo runs."""
    assert all(round(c["ratio_a"], 3) == round(c["ratio_b"], 3) for c in DTYPES["cells"])
    assert "The compression ratio of every cell agrees to three decimals." in flat(doc(RESULTS))


# --- docs/pipeline.md: the forecast table is its command's output --------------------------------------------------


def forecast(*configs: Path) -> dict[tuple[str, str], list[str]]:
    """`python -m kvzap.plan CONFIG ... --forecast`, by (layout, model) of the evaluation and total rows."""
    out = subprocess.run(
        [sys.executable, "-m", "kvzap.plan", *map(str, configs), "--forecast"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = [line.split() for line in out.splitlines() if line.split()[:1] in (["per-cell"], ["shared"])]
    return {(r[0], r[2]): r[3:] for r in rows if r[1] in ("evaluate", "all")}


def test_forecast_table_is_its_command():
    printed = forecast(ROOT / "config" / "paper.yaml")
    rows = table(doc(PIPELINE), "For `config/paper.yaml`")
    expected = [
        [layout, model, *([float(v.replace(",", ""))] for v in printed[layout, model])] for layout, model, *_ in rows
    ]
    assert len(rows) == len(printed)
    assert row_mismatches(rows, expected) == []


def test_forecast_prose_is_its_command(tmp_path):
    """683 expected GPU-hours with AIME's batched rollouts, 1,229 with one rollout per generate call."""
    one_row = tmp_path / "batch_1.yaml"
    one_row.write_text("evaluation:\n  batch_size: {qwen3-8b: 1, llama-3.1-8b-instruct: 1, qwen3-32b: 1}\n")
    batched = forecast(ROOT / "config" / "paper.yaml")["shared", "all"][4]
    single = forecast(ROOT / "config" / "paper.yaml", one_row)["shared", "all"][4]
    claim = "683 expected GPU-hours in all, against 1,229 with one rollout per call"
    assert claim in flat(doc(PIPELINE))
    assert mismatches(numbers(claim), [float(batched.replace(",", "")), float(single.replace(",", ""))]) == []


# --- the comparison can fail ------------------------------------------------------------------------------------


def test_a_changed_number_is_caught():
    """One digit changed in a table row or a claim is reported, so the tests above are not vacuous."""
    row = "| 2048 | 0.49 | 0.53 | 0.52 | 1.00 | 0.79 |"
    edited = doc(BENCHMARKS).replace(row, row.replace("0.79", "0.81"))
    assert edited != doc(BENCHMARKS)
    assert row_mismatches(table(edited, "Physical eviction"), eviction_rows()) == [
        "row 1 cell 6: 0.81 is not 0.7949617969681797"
    ]
    claim = "shared the cores (682 ms per step)"
    assert mismatches(numbers(claim.replace("682", "680")), [SERVING["full"]["decode_ms_per_step"]]) != []
    assert not rounds_to("0.540", 0.5406) and rounds_to("0.540", 0.5404) and rounds_to("3e-5", 3.19e-5)
    assert numbers("Qwen3-8B at 16k, τ −2.6 over 5,046 pairs, 7.5k float32 2.4e-5") == ["-2.6", "5046", "2.4e-5"]
