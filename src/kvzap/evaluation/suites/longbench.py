"""LongBench (THUDM/LongBench v1): 21 subsets, English, Chinese and code, with the official prompts and metrics.

Sources:
  hub             THUDM/LongBench's `data.zip` (one `<task>.jsonl` per subset). Its loading script no longer
                  runs under datasets>=4, so the zip is fetched with huggingface_hub and read directly.
                  (kvpress's script pushes the 16 English subsets to `Xnhyacinth/LongBench`; the paper reports all 21.)
  local:<folder>  a folder holding `<task>.jsonl` files in the same schema: input, context, answers, length,
                  dataset, language, all_classes, _id.

Each row is cut as kvpress's `create_huggingface_dataset.py` cuts it (the dataset behind the paper's numbers), and
tests/test_kvpress_reference.py runs that script on the same raw rows: the context part (instructions, the document
and, for the QA tasks, the reminder after it) is compressed; the question and the answer prefix follow uncompressed,
the chat template's end of turn between them. trec, triviaqa and samsum end their `input` with the answer cue
("Type:", "Answer:", "Summary:"), which moves to the answer prefix; lsht keeps its cue "类别：" in the question, with
no answer prefix (kvpress's prompts give it none). context + question + answer_prefix is the official prompt.

Generation length: LongBench's `dataset2maxlen.json` value + 20 tokens, as in kvpress's dataset (so the
paper's runs): the metric reads the first line (few-shot tasks), one line (code) or the start of the answer,
and the slack only avoids cutting a final word.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from kvzap.evaluation.metrics import longbench_score
from kvzap.evaluation.predictions import mean_over_seeds
from kvzap.evaluation.suites.catalog import LONGBENCH_SUBSETS
from kvzap.intervals import task_scores
from kvzap.prepare import archives
from kvzap.prepare.hub_files import dataset_revision

HUB_DATASET = "THUDM/LongBench"
_QA_EN = "Answer the question based on the given passages. Only give me the answer and do not output any other words."
# The official prompts (LongBench config/dataset2prompt.json) in kvpress's three parts. The context part (instruction,
# document, and for QA the reminder after it) is compressed; the question, the chat template's end of turn and the
# answer prefix follow uncompressed, so where a prompt is cut changes what the model reads. NarrativeQA keeps the
# official "asconcisely" typo, as THUDM's and kvpress's prompts do.
CONTEXT_TEMPLATES = {
    "narrativeqa": "You are given a story, which can be either a novel or a movie script, and a question. Answer the question asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nStory: {context}\n\nNow, answer the question based on the story asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\n",
    "qasper": 'You are given a scientific article and a question. Answer the question as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based on the information in the article, write "unanswerable". If the question is a yes/no question, answer "yes", "no", or "unanswerable". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question based on the above article as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based on the information in the article, write "unanswerable". If the question is a yes/no question, answer "yes", "no", or "unanswerable". Do not provide any explanation.\n\n',
    "multifieldqa_en": "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on the above text, only give me the answer and do not output any other words.\n\n",
    "multifieldqa_zh": "阅读以下文字并用中文简短回答：\n\n{context}\n\n现在请基于上面的文章回答下面的问题，只告诉我答案，不要输出任何其他字词。\n\n",
    "hotpotqa": f"{_QA_EN}\n\nThe following are given passages.\n{{context}}\n\n{_QA_EN}\n\n",
    "2wikimqa": f"{_QA_EN}\n\nThe following are given passages.\n{{context}}\n\n{_QA_EN}\n\n",
    "musique": f"{_QA_EN}\n\nThe following are given passages.\n{{context}}\n\n{_QA_EN}\n\n",
    "dureader": "请基于给定的文章回答下述问题。\n\n文章：{context}\n\n请基于上述文章回答下面的问题。\n\n",
    "gov_report": "You are given a report by a government agency. Write a one-page summary of the report.\n\nReport:\n{context}\n\n",
    "qmsum": "You are given a meeting transcript and a query containing a question or instruction. Answer the query in one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above meeting transcript in one or more sentences.\n\n",
    "multi_news": "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\n",
    "vcsum": "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n",
    "trec": "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n",
    "triviaqa": "Answer the question based on the given passage. Only give me the answer and do not output any other words. The following are some examples.\n\n{context}\n\n",
    "samsum": "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n",
    "lsht": "请判断给定新闻的类别，下面是一些例子。\n\n{context}\n",
    "passage_count": "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully read these paragraphs and determine how many unique paragraphs there are after removing duplicates. In other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\n",
    "passage_retrieval_en": "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n",
    "passage_retrieval_zh": "以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n{context}\n\n下面是一个摘要\n\n",
    "lcc": "Please complete the code given below. \n{context}",
    "repobench-p": "Please complete the code given below. \n{context}",
}
QUESTION_TEMPLATES = {
    "narrativeqa": "Question: {input}\n\n",
    "qasper": "Question: {input}\n\n",
    "multifieldqa_en": "Question: {input}\n",
    "multifieldqa_zh": "问题：{input}\n",
    "hotpotqa": "Question: {input}\n",
    "2wikimqa": "Question: {input}\n",
    "musique": "Question: {input}\n",
    "dureader": "问题：{input}\n",
    "gov_report": "Now, write a one-page summary of the report.\n\n",
    "qmsum": "Query: {input}\n",
    "multi_news": "Now, write a one-page summary of all the news.\n\n",
    "vcsum": "",
    "trec": "{input}",
    "triviaqa": "{input}",
    "samsum": "{input}",
    "lsht": "{input}",
    "passage_count": "Please enter the final count of unique paragraphs after removing duplicates. The output format should only contain the number, such as 1, 2, 3, and so on.\n\n",
    "passage_retrieval_en": '{input}\n\nPlease enter the number of the paragraph that the abstract is from. The answer format must be like "Paragraph 1", "Paragraph 2", etc.\n\n',
    "passage_retrieval_zh": '{input}\n\n请输入摘要所属段落的编号。答案格式必须是"段落1"，"段落2"等格式\n\n',
    "lcc": "{input}",
    "repobench-p": "{input}",
}
# lsht has none: its input ends with its cue "类别：", which stays in the question (kvpress's prompts give lsht no
# answer prefix). trec, triviaqa and samsum end their input with the cue that kvpress moves to the answer prefix.
ANSWER_PREFIXES = {
    "narrativeqa": "Answer:",
    "qasper": "Answer:",
    "multifieldqa_en": "Answer:",
    "multifieldqa_zh": "回答：",
    "hotpotqa": "Answer:",
    "2wikimqa": "Answer:",
    "musique": "Answer:",
    "dureader": "回答：",
    "gov_report": "Summary:",
    "qmsum": "Answer:",
    "multi_news": "Summary:",
    "vcsum": "会议总结：",
    "trec": "Type:",
    "triviaqa": "Answer:",
    "samsum": "Summary:",
    "lsht": "",
    "passage_count": "The final answer is: ",
    "passage_retrieval_en": "The answer is: ",
    "passage_retrieval_zh": "答案是：",
    "lcc": "Next line of code:\n",
    "repobench-p": "Next line of code:\n",
}
CUE_IN_INPUT = ("trec", "triviaqa", "samsum")
OFFICIAL_MAX_NEW_TOKENS = {
    "narrativeqa": 128,
    "qasper": 128,
    "multifieldqa_en": 64,
    "multifieldqa_zh": 64,
    "hotpotqa": 32,
    "2wikimqa": 32,
    "musique": 32,
    "dureader": 128,
    "gov_report": 512,
    "qmsum": 512,
    "multi_news": 512,
    "vcsum": 512,
    "trec": 64,
    "triviaqa": 32,
    "samsum": 128,
    "lsht": 64,
    "passage_count": 32,
    "passage_retrieval_en": 32,
    "passage_retrieval_zh": 32,
    "lcc": 64,
    "repobench-p": 64,
}
KVPRESS_EXTRA_NEW_TOKENS = 20


def split_prompt(task: str, context: str, input_: str) -> tuple[str, str, str]:
    """(context, question, answer_prefix) of one row, as kvpress's LongBench dataset holds them: together, the
    official prompt (for trec, triviaqa and samsum, with the answer cue moved from the input's end to the prefix)."""
    answer_prefix = ANSWER_PREFIXES[task]
    if task in CUE_IN_INPUT:
        input_ = input_.removesuffix(answer_prefix)
    return CONTEXT_TEMPLATES[task].format(context=context), QUESTION_TEMPLATES[task].format(input=input_), answer_prefix


def download_hub(revision: str | None = None) -> tuple[Path, str]:
    """THUDM/LongBench's data.zip from the Hub (at `revision`), extracted once per content outside the Hub cache
    (kvzap.prepare.archives); returns the jsonl folder and the `<repo>@<commit>` read."""
    from huggingface_hub import hf_hub_download

    archive = Path(hf_hub_download(HUB_DATASET, "data.zip", repo_type="dataset", revision=revision))
    return archives.extracted(archive) / "data", dataset_revision(HUB_DATASET, [archive])


def read_task(folder: Path, task: str) -> list[dict]:
    path = Path(folder) / f"{task}.jsonl"
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def to_row(task: str, record: dict) -> dict:
    context, question, answer_prefix = split_prompt(task, record["context"], record["input"])
    return {
        "sample_id": f"{task}-{record['_id']}",
        "task": task,
        "context": context,
        "question": question,
        "answer_prefix": answer_prefix,
        "answers": [str(a) for a in record["answers"]],
        "max_new_tokens": OFFICIAL_MAX_NEW_TOKENS[task] + KVPRESS_EXTRA_NEW_TOKENS,
        "all_classes": list(record["all_classes"] or []),
        "length": int(record["length"]),
        "language": record["language"],
    }


def load(
    source: str, subset: str, tokenizer=None, n_samples: int | None = None, seed: int = 42, revision: str | None = None
) -> pd.DataFrame:
    """One LongBench subset in the harness schema; `attrs["revision"]` names what was read. `tokenizer` is unused:
    the rows are text, and the job handles samples longer than the model's positions."""
    if subset not in CONTEXT_TEMPLATES:
        raise ValueError(f"Unknown LongBench subset {subset!r}; the 21 are {list(LONGBENCH_SUBSETS)}")
    if source == "hub":
        folder, read = download_hub(revision)
    elif source.startswith("local:"):
        folder = Path(source.removeprefix("local:"))
        read = source
    else:
        raise ValueError(f"LongBench has no offline generator; use 'hub' or 'local:<folder>', not {source!r}")
    df = pd.DataFrame([to_row(subset, r) for r in read_task(folder, subset)])
    if n_samples and n_samples < len(df):
        df = df.sample(n_samples, random_state=seed).sort_index()
    df = df.reset_index(drop=True)
    df.attrs["revision"] = read
    return df


def score(predictions: pd.DataFrame, departures: frozenset[str] = frozenset()) -> dict:
    """Per-subset score (x100), their mean, and the mean without TREC (the paper's Fig 12), with 95 % intervals."""
    per_row = pd.Series(
        [
            longbench_score(t, p, list(a), c, departures)
            for t, p, a, c in zip(
                predictions["task"], predictions["prediction"], predictions["answers"], predictions["all_classes"]
            )
        ],
        index=predictions["task"].to_numpy(),
    )
    per_row = mean_over_seeds(per_row, predictions)
    without_trec = per_row[per_row.index != "trec"]
    rest = task_scores(without_trec) if len(without_trec) else {"average": None, "average_ci": None}
    return {
        **task_scores(per_row, LONGBENCH_SUBSETS),
        "average_without_trec": rest["average"],
        "average_without_trec_ci": rest["average_ci"],
    }
