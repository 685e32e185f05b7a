"""The names each benchmark accepts, without importing a loader: what the config checks test subsets and tasks
against before any job starts. The loaders import these tuples, so there is one list of each."""

RULER_NIAH_TASKS = (
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
)
RULER_OFFLINE_TASKS = (*RULER_NIAH_TASKS, "vt", "cwe", "fwe")
RULER_HUB_ONLY_TASKS = ("qa_1", "qa_2")  # SQuAD / HotpotQA: no package ships them
RULER_TASKS = (*RULER_OFFLINE_TASKS, *RULER_HUB_ONLY_TASKS)

LONGBENCH_SUBSETS = (
    "narrativeqa",
    "qasper",
    "multifieldqa_en",
    "multifieldqa_zh",
    "hotpotqa",
    "2wikimqa",
    "musique",
    "dureader",
    "gov_report",
    "qmsum",
    "multi_news",
    "vcsum",
    "trec",
    "triviaqa",
    "samsum",
    "lsht",
    "passage_count",
    "passage_retrieval_en",
    "passage_retrieval_zh",
    "lcc",
    "repobench-p",
)

AIME_SUBSETS = ("aime25",)
# Benchmarks that sample rollouts under decoding-time compression: each cell keeps its own job (no shared prefill).
SAMPLED_BENCHMARKS = ("aime25",)
