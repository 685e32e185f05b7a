"""Benchmark metrics, each as kvpress's evaluation code scores it (scores in [0, 1]; callers x100).

kvpress's evaluation produced the paper's numbers, so its scorers are the reference, prediction by prediction
(tests/test_kvpress_reference.py runs them from kvpress's sdist on a bank of edge cases):
  RULER      NVIDIA/RULER's string_match_all / string_match_part after kvpress's cleaning (strip, control
             characters removed, newlines included).
  LongBench  THUDM/LongBench's metrics as kvpress's `calculate_metrics.py` applies them: every prediction
             left-stripped, only the first line for the few-shot tasks trec/triviaqa/samsum/lsht, the best score
             over the references.
  AIME       the content of the last `boxed{...}` (braces matched, nothing trimmed) equals the gold answer as a
             string; pass@k.
A deliberate departure from kvpress is a named option (DEPARTURES), off unless evaluation.departures lists it.
"""

from __future__ import annotations

import re
import string
import warnings
from collections import Counter
from math import comb

# Deliberate departures from kvpress's scoring: name -> what it changes. Off by default (the paper's scoring).
DEPARTURES = {
    "longbench_classification_fix": (
        "trec and lsht: every class name that is a strict part of the reference is dropped; LongBench's loop "
        "removes such names from the list it iterates, so the name after each removed one stays counted"
    )
}

_CONTROL = re.compile(r"[\x00-\x1f]")


def _clean(prediction: str) -> str:
    """kvpress's RULER cleaning: strip, remove every control character (so a number split by a newline joins up),
    strip again; lower-cased for the case-insensitive match."""
    return _CONTROL.sub("", prediction.strip()).strip().lower()


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
    """ROUGE-L F from the `rouge` package; 0 wherever it raises (an empty or punctuation-only side, a recursion
    limit on long texts), as LongBench scores any failure."""
    from rouge import Rouge

    try:
        return Rouge().get_scores([prediction], [reference], avg=True)["rouge-l"]["f"]
    except Exception:  # noqa: BLE001 - LongBench maps every failure of the package to 0
        return 0.0


def rouge_l_zh(prediction: str, reference: str) -> float:
    """Chinese ROUGE-L: the same score over jieba words joined by spaces."""
    return rouge_l(" ".join(_jieba_words(prediction)), " ".join(_jieba_words(reference)))


def classification(prediction: str, reference: str, all_classes: list[str], fix_loop: bool = False) -> float:
    """1/#matches when the reference class is among the class names found in the prediction, else 0.

    Names that are a strict part of the reference are meant not to count as extra matches, but LongBench's loop
    removes them from the list it is iterating, which skips the name after each removal: that is how the paper's
    numbers were scored. `fix_loop` (departure longbench_classification_fix) drops all of them. (LongBench's difflib
    fallback for predictions naming no class is unreachable in its code, and so here.)
    """
    found = [c for c in all_classes if c in prediction]
    if fix_loop:
        found = [c for c in found if c == reference or c not in reference]
    else:
        i = 0
        while i < len(found):  # a removal slides the next name into the index just visited, which is not revisited
            name = found[i]
            if name in reference and name != reference:
                found.remove(name)
            i += 1
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
    return prediction.lstrip().split("\n")[0]


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


def longbench_score(
    task: str,
    prediction: str,
    references: list[str],
    all_classes: list[str] | None = None,
    departures: frozenset[str] = frozenset(),
) -> float:
    """One LongBench prediction: the best score over its references, with the task's official metric, on the
    left-stripped prediction (its first line for the few-shot tasks)."""
    metric = LONGBENCH_METRICS[task]
    prediction = first_line(prediction) if task in FIRST_LINE_TASKS else prediction.lstrip()
    if metric is classification:
        fix = "longbench_classification_fix" in departures
        return max(classification(prediction, ref, list(all_classes), fix_loop=fix) for ref in references)
    return max(metric(prediction, ref) for ref in references)


# ---------------------------------------------------------------------------------------------------- AIME


def extract_boxed(text: str) -> str | None:
    """The content of the last `boxed{...}`, matching braces so `\\boxed{\\frac{1}{2}}` gives `\\frac{1}{2}`;
    kept as written (no trimming: `\\boxed{ 70 }` is not "70").

    None when there is no box or the last one is never closed (a truncated generation).
    """
    marker = "boxed{"
    start = text.rfind(marker)
    if start == -1:
        return None
    depth = 0
    for i in range(start + len(marker) - 1, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start + len(marker) : i]
    return None


def aime_correct(prediction: str, answer) -> bool:
    """AIME: the last boxed answer equals the gold answer as a string (kvpress's rule: `070` is not `70`)."""
    return extract_boxed(prediction) == str(answer)


def aime_answered(prediction: str) -> bool:
    """Whether a rollout wrote a box at all (kvpress counts `boxed{` anywhere, closed or not)."""
    return "boxed{" in prediction


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    return 1.0 - comb(n - c, k) / comb(n, k)
