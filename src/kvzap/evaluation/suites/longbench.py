"""LongBench (THUDM/LongBench v1): 21 subsets, English, Chinese and code, with the official prompts and metrics.

Sources:
  hub             THUDM/LongBench's `data.zip` (one `<task>.jsonl` per subset). Its loading script no longer
                  runs under datasets>=4, so the zip is fetched with huggingface_hub and read directly.
                  (kvpress's `Xnhyacinth/LongBench` holds only the 16 English subsets.)
  local:<folder>  a folder holding `<task>.jsonl` files in the same schema: input, context, answers, length,
                  dataset, language, all_classes, _id.

Each official prompt (LongBench `config/dataset2prompt.json`) is split as kvpress's
`create_huggingface_dataset.py` splits it: the context part (instructions, the document and, for the QA tasks,
the reminder after it) is compressed; the question and answer prefix follow uncompressed. For trec, triviaqa,
samsum and lsht the answer cue ("Type:", "Answer:", ...) ends the dataset's `input` and is moved to the
answer prefix. context + question + answer_prefix always equals the official prompt.

Generation length: LongBench's `dataset2maxlen.json` value + 20 tokens, as in kvpress's dataset (so the
paper's runs): the metric reads the first line (few-shot tasks), one line (code) or the start of the answer,
and the slack only avoids cutting a final word.
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pandas as pd

from kvzap.evaluation.metrics import longbench_score
from kvzap.evaluation.suites.catalog import LONGBENCH_SUBSETS
from kvzap.intervals import task_scores

HUB_DATASET = "THUDM/LongBench"
_QA_EN = "Answer the question based on the given passages. Only give me the answer and do not output any other words."
PROMPTS = {
    "narrativeqa": "You are given a story, which can be either a novel or a movie script, and a question. Answer the question as concisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nStory: {context}\n\nNow, answer the question based on the story as concisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:",  # noqa: E501
    "qasper": 'You are given a scientific article and a question. Answer the question as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based on the information in the article, write "unanswerable". If the question is a yes/no question, answer "yes", "no", or "unanswerable". Do not provide any explanation.\n\nArticle: {context}\n\n Answer the question based on the above article as concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based on the information in the article, write "unanswerable". If the question is a yes/no question, answer "yes", "no", or "unanswerable". Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:',  # noqa: E501
    "multifieldqa_en": "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on the above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:",  # noqa: E501
    "multifieldqa_zh": "阅读以下文字并用中文简短回答：\n\n{context}\n\n现在请基于上面的文章回答下面的问题，只告诉我答案，不要输出任何其他字词。\n\n问题：{input}\n回答：",
    "hotpotqa": f"{_QA_EN}\n\nThe following are given passages.\n{{context}}\n\n{_QA_EN}\n\nQuestion: {{input}}\nAnswer:",
    "2wikimqa": f"{_QA_EN}\n\nThe following are given passages.\n{{context}}\n\n{_QA_EN}\n\nQuestion: {{input}}\nAnswer:",
    "musique": f"{_QA_EN}\n\nThe following are given passages.\n{{context}}\n\n{_QA_EN}\n\nQuestion: {{input}}\nAnswer:",
    "dureader": "请基于给定的文章回答下述问题。\n\n文章：{context}\n\n请基于上述文章回答下面的问题。\n\n问题：{input}\n回答：",
    "gov_report": "You are given a report by a government agency. Write a one-page summary of the report.\n\nReport:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:",  # noqa: E501
    "qmsum": "You are given a meeting transcript and a query containing a question or instruction. Answer the query in one or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above meeting transcript in one or more sentences.\n\nQuery: {input}\nAnswer:",  # noqa: E501
    "multi_news": "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\nNow, write a one-page summary of all the news.\n\nSummary:",  # noqa: E501
    "vcsum": "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n会议总结：",
    "trec": "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}",
    "triviaqa": "Answer the question based on the given passage. Only give me the answer and do not output any other words. The following are some examples.\n\n{context}\n\n{input}",  # noqa: E501
    "samsum": "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}",
    "lsht": "请判断给定新闻的类别，下面是一些例子。\n\n{context}\n{input}",
    "passage_count": "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully read these paragraphs and determine how many unique paragraphs there are after removing duplicates. In other words, how many non-repeating paragraphs are there in total?\n\n{context}\n\nPlease enter the final count of unique paragraphs after removing duplicates. The output format should only contain the number, such as 1, 2, 3, and so on.\n\nThe final answer is: ",  # noqa: E501
    "passage_retrieval_en": 'Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the abstract is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\nPlease enter the number of the paragraph that the abstract is from. The answer format must be like "Paragraph 1", "Paragraph 2", etc.\n\nThe answer is: ',  # noqa: E501
    "passage_retrieval_zh": '以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n{context}\n\n下面是一个摘要\n\n{input}\n\n请输入摘要所属段落的编号。答案格式必须是"段落1"，"段落2"等格式\n\n答案是：',  # noqa: E501
    "lcc": "Please complete the code given below. \n{context}Next line of code:\n",
    "repobench-p": "Please complete the code given below. \n{context}{input}Next line of code:\n",
}
# Where the question starts in the template, and the answer prefix (the template's or the input's ending).
SPLITS = {
    "narrativeqa": ("Question: {input}", "Answer:"),
    "qasper": ("Question: {input}", "Answer:"),
    "multifieldqa_en": ("Question: {input}", "Answer:"),
    "multifieldqa_zh": ("问题：{input}", "回答："),
    "hotpotqa": ("Question: {input}", "Answer:"),
    "2wikimqa": ("Question: {input}", "Answer:"),
    "musique": ("Question: {input}", "Answer:"),
    "dureader": ("问题：{input}", "回答："),
    "gov_report": ("Now, write a one-page summary", "Summary:"),
    "qmsum": ("Query: {input}", "Answer:"),
    "multi_news": ("Now, write a one-page summary", "Summary:"),
    "vcsum": ("会议总结：", "会议总结："),
    "trec": ("{input}", "Type:"),
    "triviaqa": ("{input}", "Answer:"),
    "samsum": ("{input}", "Summary:"),
    "lsht": ("{input}", "类别："),
    "passage_count": ("Please enter the final count", "The final answer is: "),
    "passage_retrieval_en": ("{input}", "The answer is: "),
    "passage_retrieval_zh": ("{input}", "答案是："),
    "lcc": ("Next line of code:\n", "Next line of code:\n"),
    "repobench-p": ("{input}", "Next line of code:\n"),
}
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
    """(context, question, answer_prefix) whose concatenation is the official prompt for this row."""
    template = PROMPTS[task]
    marker, answer_prefix = SPLITS[task]
    cut = template.index(marker)
    question = template[cut:].format(input=input_).removesuffix(answer_prefix)
    return template[:cut].format(context=context), question, answer_prefix


def download_hub() -> Path:
    """THUDM/LongBench's data.zip from the Hub, extracted once next to the cached zip; returns the jsonl folder."""
    from huggingface_hub import hf_hub_download

    archive = Path(hf_hub_download(HUB_DATASET, "data.zip", repo_type="dataset"))
    folder = archive.parent / "extracted"
    if not (folder / "data").is_dir():
        with zipfile.ZipFile(archive) as zf:
            zf.extractall(folder)
    return folder / "data"


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


def load(source: str, subset: str, tokenizer=None, n_samples: int | None = None, seed: int = 42) -> pd.DataFrame:
    """One LongBench subset in the harness schema. `tokenizer` is unused: the rows are text and the harness
    truncates contexts longer than the model allows."""
    if subset not in PROMPTS:
        raise ValueError(f"Unknown LongBench subset {subset!r}; the 21 are {list(LONGBENCH_SUBSETS)}")
    if source == "hub":
        folder = download_hub()
    elif source.startswith("local:"):
        folder = Path(source.removeprefix("local:"))
    else:
        raise ValueError(f"LongBench has no offline generator; use 'hub' or 'local:<folder>', not {source!r}")
    df = pd.DataFrame([to_row(subset, r) for r in read_task(folder, subset)])
    if n_samples and n_samples < len(df):
        df = df.sample(n_samples, random_state=seed).sort_index()
    return df.reset_index(drop=True)


def score(predictions: pd.DataFrame) -> dict:
    """Per-subset score (x100), their mean, and the mean without TREC (the paper's Fig 12), with 95 % intervals."""
    per_row = pd.Series(
        [
            longbench_score(t, p, list(a), c)
            for t, p, a, c in zip(
                predictions["task"], predictions["prediction"], predictions["answers"], predictions["all_classes"]
            )
        ],
        index=predictions["task"].to_numpy(),
    )
    without_trec = per_row[per_row.index != "trec"]
    rest = task_scores(without_trec) if len(without_trec) else {"average": None, "average_ci": None}
    return {
        **task_scores(per_row, LONGBENCH_SUBSETS),
        "average_without_trec": rest["average"],
        "average_without_trec_ci": rest["average_ci"],
    }
