"""The numbers in docs/ and benchmarks/README.md are their records' numbers: every table built from a committed JSON
record is its rendering by benchmarks/doc_tables.py, the prose's headline numbers are checked one claim at a time, and
the cost forecast's table is rerun with its own command (a doc edited by hand, or a record replaced, fails here).

A printed number matches a value when the value rounds to it at the printed precision ("0.540" is 0.5395-0.5405)."""

from __future__ import annotations

import functools
import json
import re
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from kvzap.report.flops import LayerShape, share

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import doc_tables  # noqa: E402  (benchmarks/ is a folder of scripts, not a package)

sys.path.remove(str(ROOT / "benchmarks"))
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


RESULTS, BENCHMARKS, PIPELINE = "docs/results.md", "benchmarks/README.md", "docs/pipeline.md"


@pytest.mark.parametrize("name", doc_tables.TABLES)
def test_table_is_its_record(name):
    """Each table is its record rendered (benchmarks/doc_tables.py), character for character."""
    spec = doc_tables.TABLES[name]
    printed = spec.printed(doc(spec.doc)).group(0)
    assert printed == spec.render(), f"{spec.doc}: run `python benchmarks/doc_tables.py --fix` once the record is right"


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
        "25,200 prefill tokens/s, a 70 ms decoding step",
        [round(GPU_8K["context_tokens"] / GPU_8K["prefill_s"]["full"], -2), GPU_8K["decode_ms"]["full"]],
    ),
    (
        PIPELINE,
        "1.16× (prepare), 1.03× (oracle), 0.82× (surrogates), 0.94× (evaluation) and 1.04× (tables and figures)",
        [stage["ratio"] for stage in rec("cpu/demo_forecast.json")["forecast"]["stages"]],
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
    """1,695 expected GPU-hours with AIME's batched rollouts, 3,148 with one rollout per generate call."""
    one_row = tmp_path / "batch_1.yaml"
    one_row.write_text("evaluation:\n  batch_size: {qwen3-8b: 1, llama-3.1-8b-instruct: 1, qwen3-32b: 1}\n")
    batched = forecast(ROOT / "config" / "paper.yaml")["shared", "all"][5]
    single = forecast(ROOT / "config" / "paper.yaml", one_row)["shared", "all"][5]
    claim = "1,695 expected GPU-hours in all, against 3,148 with one rollout per call"
    assert claim in flat(doc(PIPELINE))
    assert mismatches(numbers(claim), [float(batched.replace(",", "")), float(single.replace(",", ""))]) == []
    rows = forecast(ROOT / "config" / "paper.yaml")
    per_token = {
        m: float(rows["shared", m][5].replace(",", "")) / float(rows["shared", m][1].replace(",", ""))
        for m in ("qwen3-8b", "qwen3-32b")
    }
    claim = "Qwen3-32B costs 4.8× Qwen3-8B's GPU-hours per prefill token"
    assert claim in flat(doc(PIPELINE))
    assert mismatches(numbers(claim), [per_token["qwen3-32b"] / per_token["qwen3-8b"]]) == []
    claim = "654 evaluation jobs, priced as SLURM bills: about 1,695 GPU-hours expected (3,885 at most)"
    assert claim in flat(doc("README.md"))
    jobs = sum(int(rows["shared", m][0]) for m in ("qwen3-8b", "llama-3.1-8b-instruct", "qwen3-32b"))
    expected, most = (float(rows["shared", "all"][i].replace(",", "")) for i in (5, 6))
    assert mismatches(numbers(claim), [jobs, expected, most]) == []


# --- the comparison can fail ------------------------------------------------------------------------------------


def test_a_changed_number_is_caught():
    """One digit changed in a table row or a claim is reported, so the tests above are not vacuous."""
    spec = doc_tables.TABLES["eviction"]
    row = "| 2048 | 0.49 | 0.53 | 0.52 | 1.00 | 0.79 |"
    assert row in spec.render()
    edited = doc(BENCHMARKS).replace(row, row.replace("0.79", "0.81"))
    assert edited != doc(BENCHMARKS) and spec.printed(edited).group(0) != spec.render()
    claim = "shared the cores (682 ms per step)"
    assert mismatches(numbers(claim.replace("682", "680")), [SERVING["full"]["decode_ms_per_step"]]) != []
    assert not rounds_to("0.540", 0.5406) and rounds_to("0.540", 0.5404) and rounds_to("3e-5", 3.19e-5)
    assert numbers("Qwen3-8B at 16k, τ −2.6 over 5,046 pairs, 7.5k float32 2.4e-5") == ["-2.6", "5046", "2.4e-5"]


def test_fix_rewrites_a_stale_table_and_only_it(tmp_path, monkeypatch):
    """`doc_tables.py --fix` puts the rendering in place of a stale block, leaving the text around it alone."""
    spec = doc_tables.TABLES["eviction"]
    stale = doc(BENCHMARKS).replace("| 0.79 |", "| 0.81 |", 1)
    (tmp_path / "benchmarks").mkdir()
    (tmp_path / BENCHMARKS).write_text(stale, encoding="utf-8")
    monkeypatch.setattr(doc_tables, "ROOT", tmp_path)
    monkeypatch.setattr(doc_tables, "TABLES", {"eviction": spec})
    monkeypatch.setattr(doc_tables, "rec", lambda name: json.loads((ROOT / "benchmarks" / name).read_text()))
    assert doc_tables.fix() == ["eviction"]
    assert (tmp_path / BENCHMARKS).read_text(encoding="utf-8") == doc(BENCHMARKS)
    assert doc_tables.fix() == []
