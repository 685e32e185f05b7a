"""Benchmark metrics, each as the benchmark's official scorer defines it (scores in [0, 1]; callers x100).

RULER: NVIDIA/RULER's string_match_all / string_match_part (as kvpress applies them).
LongBench: THUDM/LongBench `metrics.py` + `eval.py` (max over references, first line only for the few-shot
tasks trec/triviaqa/samsum/lsht). AIME: the last `\\boxed{...}` answer, with nested braces, and pass@k.
"""

from __future__ import annotations

import re
import string
import warnings
from collections import Counter
from math import comb

_CONTROL = re.compile(r"[\x00-\x1f]")


def _clean(prediction: str) -> str:
    return _CONTROL.sub("\n", prediction).strip().lower()


def string_match_all(prediction: str, references: list[str]) -> float:
    """RULER: the fraction of references found (case-insensitive substring) in the prediction."""
    text = _clean(prediction)
    return sum(ref.lower() in text for ref in references) / len(references)


def string_match_part(prediction: str, references: list[str]) -> float:
    """RULER qa tasks: 1 if any reference is found in the prediction."""
    text = _clean(prediction)
    return float(any(ref.lower() in text for ref in references))


def ruler_score(task: str, prediction: str, references: list[str]) -> float:
    return (string_match_part if task.startswith("qa") else string_match_all)(prediction, references)


# ----------------------------------------------------------------------------------------------- LongBench

_ZH_PUNCTUATION = "！？｡。＂＃＄％＆＇（）＊＋，－／：；＜＝＞＠［＼］＾＿｀｛｜｝～｟｠｢｣､、〃》「」『』【】〔〕〖〗〘〙〚〛〜〝〞〟〰〾〿–—‘’‛“”„‟…‧﹏."
_EN_EXCLUDE = set(string.punctuation)
_ZH_EXCLUDE = set(string.punctuation + _ZH_PUNCTUATION)


def normalize_answer(text: str) -> str:
    """SQuAD-style: lower case, drop punctuation, then the articles a/an/the, then collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _EN_EXCLUDE)
    return " ".join(re.sub(r"\b(a|an|the)\b", " ", text).split())


def normalize_zh_answer(text: str) -> str:
    """Chinese variant: lower case, drop English and Chinese punctuation and all whitespace."""
    return "".join("".join(ch for ch in text.lower() if ch not in _ZH_EXCLUDE).split())


def token_f1(prediction: list[str], reference: list[str]) -> float:
    """Harmonic mean of token precision and recall over the multiset of shared tokens."""
    same = sum((Counter(prediction) & Counter(reference)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(prediction), same / len(reference)
    return 2 * precision * recall / (precision + recall)


def _jieba_words(text: str) -> list[str]:
    import jieba  # imported late: it loads its dictionary on first use (about a second)

    return list(jieba.cut(text, cut_all=False))


def qa_f1(prediction: str, reference: str) -> float:
    """English QA: token F1 of the normalised answers, split on whitespace."""
    return token_f1(normalize_answer(prediction).split(), normalize_answer(reference).split())


def qa_f1_zh(prediction: str, reference: str) -> float:
    """Chinese QA: token F1 over jieba words, each normalised, empty ones dropped."""

    def words(text: str) -> list[str]:
        return [w for w in map(normalize_zh_answer, _jieba_words(text)) if w]

    return token_f1(words(prediction), words(reference))


def rouge_l(prediction: str, reference: str) -> float:
    """ROUGE-L F from the `rouge` package; 0 where it refuses the input (an empty or punctuation-only side)."""
    from rouge import Rouge

    try:
        return Rouge().get_scores([prediction], [reference], avg=True)["rouge-l"]["f"]
    except (ValueError, RecursionError):
        return 0.0


def rouge_l_zh(prediction: str, reference: str) -> float:
    """Chinese ROUGE-L: the same score over jieba words joined by spaces."""
    return rouge_l(" ".join(_jieba_words(prediction)), " ".join(_jieba_words(reference)))


def classification(prediction: str, reference: str, all_classes: list[str]) -> float:
    """1/#matches when the reference class is among the class names found in the prediction, else 0.

    Class names that are strict substrings of the reference do not count as extra matches. (LongBench's
    code removes them while iterating the same list, which can skip one; its difflib fallback is unreachable.)
    """
    found = [c for c in all_classes if c in prediction]
    found = [c for c in found if c == reference or c not in reference]
    return 1.0 / len(found) if reference in found else 0.0


def _share_equal(prediction: str, target: str) -> float:
    """The fraction of the numbers written in the prediction that equal the target (0 if none)."""
    numbers = re.findall(r"\d+", prediction)
    return sum(n == target for n in numbers) / len(numbers) if numbers else 0.0


def count_score(prediction: str, reference: str) -> float:
    """passage_count: the share of predicted numbers equal to the true count."""
    return _share_equal(prediction, str(reference))


def retrieval_score(prediction: str, reference: str) -> float:
    """passage_retrieval_en: the share of predicted numbers equal to N in the reference "Paragraph N"."""
    return _share_equal(prediction, re.findall(r"Paragraph (\d+)", reference)[0])


def retrieval_zh_score(prediction: str, reference: str) -> float:
    """passage_retrieval_zh: as the English one, with references written "段落N"."""
    return _share_equal(prediction, re.findall(r"段落(\d+)", reference)[0])


def code_similarity(prediction: str, reference: str) -> float:
    """lcc / repobench-p: fuzzywuzzy ratio between the reference line and the first predicted line that has
    no backtick, '#' or '//' (so fences and comments are skipped); an empty line when none qualifies."""
    with warnings.catch_warnings():  # "slow pure-python SequenceMatcher": that difflib ratio IS the reference
        warnings.simplefilter("ignore", UserWarning)
        from fuzzywuzzy import fuzz

    lines = prediction.lstrip("\n").split("\n")
    line = next((x for x in lines if "`" not in x and "#" not in x and "//" not in x), "")
    return fuzz.ratio(line, reference) / 100


def first_line(prediction: str) -> str:
    """Few-shot tasks answer on the first line; what follows is often the model continuing the pattern."""
    return prediction.lstrip("\n").split("\n")[0]


LONGBENCH_METRICS = {
    "narrativeqa": qa_f1,
    "qasper": qa_f1,
    "multifieldqa_en": qa_f1,
    "multifieldqa_zh": qa_f1_zh,
    "hotpotqa": qa_f1,
    "2wikimqa": qa_f1,
    "musique": qa_f1,
    "dureader": rouge_l_zh,
    "gov_report": rouge_l,
    "qmsum": rouge_l,
    "multi_news": rouge_l,
    "vcsum": rouge_l_zh,
    "trec": classification,
    "triviaqa": qa_f1,
    "samsum": rouge_l,
    "lsht": classification,
    "passage_count": count_score,
    "passage_retrieval_en": retrieval_score,
    "passage_retrieval_zh": retrieval_zh_score,
    "lcc": code_similarity,
    "repobench-p": code_similarity,
}
FIRST_LINE_TASKS = ("trec", "triviaqa", "samsum", "lsht")


def longbench_score(task: str, prediction: str, references: list[str], all_classes: list[str] | None = None) -> float:
    """One LongBench prediction: the best score over its references, with the task's official metric."""
    metric = LONGBENCH_METRICS[task]
    if task in FIRST_LINE_TASKS:
        prediction = first_line(prediction)
    if metric is classification:
        return max(classification(prediction, ref, list(all_classes)) for ref in references)
    return max(metric(prediction, ref) for ref in references)


# ---------------------------------------------------------------------------------------------------- AIME


def extract_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}`, matching braces so `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`.

    None when there is no box or the last one is never closed (a truncated generation).
    """
    start = text.rfind("\\boxed{")
    if start == -1:
        return None
    depth = 0
    for i in range(start + len("\\boxed"), len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + len("\\boxed{") : i].strip()
    return None


def aime_correct(prediction: str, answer: str) -> bool:
    """AIME: the last boxed answer equals the gold answer as a string (kvpress's rule, whitespace-trimmed)."""
    return extract_boxed(prediction) == str(answer).strip()


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    return 1.0 - comb(n - c, k) / comb(n, k)
