"""Every metric against cases worked out by hand (the expected numbers are derived in the comments)."""

import pytest

from kvzap.evaluation.metrics import (
    LONGBENCH_METRICS,
    aime_correct,
    classification,
    code_similarity,
    count_score,
    extract_boxed,
    first_line,
    longbench_score,
    normalize_answer,
    pass_at_k,
    qa_f1,
    qa_f1_zh,
    retrieval_score,
    retrieval_zh_score,
    rouge_l,
    rouge_l_zh,
    ruler_score,
    string_match_all,
    string_match_part,
    token_f1,
)


def test_ruler_string_match():
    # "A b" contains "a" but not "c": all = 1/2, part = 1; control characters are removed (kvpress's cleaning), so
    # a number broken by a newline still matches, and "x\x00Y" reads "xy".
    assert string_match_all("A b", ["a", "c"]) == 0.5
    assert string_match_part("A b", ["a", "c"]) == 1.0
    assert string_match_all("x\x00Y", ["xy"]) == 1.0
    assert string_match_all("12\n34", ["1234"]) == 1.0
    assert ruler_score("qa_1", "Paris", ["paris", "lyon"]) == 1.0
    assert ruler_score("niah_multivalue", "Paris", ["paris", "lyon"]) == 0.5


def test_qa_f1_english():
    # "the eiffel tower, in paris" -> [eiffel, tower, in, paris]; reference -> [eiffel, tower]:
    # 2 shared, P = 2/4, R = 2/2, F1 = 2 * 0.5 * 1 / 1.5 = 2/3.
    assert qa_f1("The Eiffel Tower, in Paris", "Eiffel Tower") == pytest.approx(2 / 3)
    assert normalize_answer("An apple!") == "apple"
    assert qa_f1("an apple", "Apple.") == 1.0
    assert qa_f1("banana", "apple") == 0.0
    # Shared tokens are counted as a multiset: [a, a, b] vs [a, c]: 1 shared, P 1/3, R 1/2, F1 = 0.4.
    assert token_f1(["a", "a", "b"], ["a", "c"]) == pytest.approx(0.4)


def test_qa_f1_chinese_uses_jieba_words():
    # jieba: 北京/是/中国/的/首都 vs 中国/的/首都/。 ("。" normalises to "" and is dropped):
    # 3 shared, P = 3/5, R = 3/3, F1 = 2 * 0.6 / 1.6 = 0.75. Per character it would be 5/7 ≈ 0.714.
    assert qa_f1_zh("北京是中国的首都", "中国的首都。") == pytest.approx(0.75)
    assert qa_f1_zh("上海", "北京") == 0.0


def test_rouge_l():
    # LCS of "cat sat on mat" / "cat is on mat" is "cat on mat": P = R = 3/4, F = 0.75.
    assert rouge_l("cat sat on mat", "cat is on mat") == pytest.approx(0.75, abs=1e-6)
    assert rouge_l("", "cat") == 0.0  # the rouge package refuses an empty hypothesis: LongBench scores 0
    # jieba: 会议/讨论/了/预算 vs 会议/讨论/了/预算/问题: LCS 4, P = 1, R = 4/5, F = 8/9.
    assert rouge_l_zh("会议讨论了预算", "会议讨论了预算问题") == pytest.approx(8 / 9, abs=1e-6)


def test_classification_counts_matched_classes():
    classes = ["city", "capital city", "country"]
    assert classification("capital city", "capital city", classes) == 1.0  # "city" is inside the answer: ignored
    assert classification("capital city or country", "capital city", classes) == 0.5  # two classes named
    assert classification("country", "capital city", classes) == 0.0
    assert classification("city", "capital city", classes) == 0.0  # only a part of the answer
    assert classification("a city, a country", "city", classes) == 0.5


def test_classification_keeps_longbench_loop_skip_unless_fixed():
    # Found in order: "capital", "city", "capital city". LongBench's loop removes "capital" (a part of the
    # reference), which slides "city" into the visited index: "city" stays counted, 1/2. Fixed: both go, 1.
    classes = ["capital", "city", "capital city"]
    assert classification("capital city", "capital city", classes) == 0.5
    assert classification("capital city", "capital city", classes, fix_loop=True) == 1.0
    fixed = frozenset({"longbench_classification_fix"})
    assert longbench_score("trec", "capital city", ["capital city"], classes) == 0.5
    assert longbench_score("trec", "capital city", ["capital city"], classes, fixed) == 1.0


def test_retrieval_and_count():
    assert retrieval_score("Paragraph 12", "Paragraph 12") == 1.0
    assert retrieval_score("Paragraph 12 or Paragraph 3", "Paragraph 12") == 0.5  # numbers 12, 3: one right
    assert retrieval_score("I do not know", "Paragraph 12") == 0.0
    assert retrieval_zh_score("答案是段落5和段落7", "段落5") == 0.5
    assert count_score("There are 14 unique paragraphs out of 20", "14") == 0.5
    assert count_score("14", 14) == 1.0


def test_code_similarity_skips_fences_and_comments():
    prediction = "\n```python\n# add one\n// also a comment\nreturn x + 1\nprint(x)\n"
    assert code_similarity(prediction, "return x + 1") == 1.0
    assert code_similarity("# only a comment", "abc") == 0.0  # no line qualifies: compared as ""
    # difflib ratio: "abcd" vs "abce" share 3 of 8 characters in total: 2 * 3 / 8 = 0.75.
    assert code_similarity("abcd", "abce") == 0.75


def test_first_line_tasks():
    assert first_line("\n\nLocation\nQuestion: next one\nType: Human") == "Location"
    assert first_line("  \n Location\nHuman") == "Location"  # left-stripped first, as kvpress does
    classes = ["Location", "Human"]
    # Only the first line is read for trec: the continuation's "Human" must not count as a second class.
    assert longbench_score("trec", "Location\nType: Human", ["Location"], classes) == 1.0
    assert classification("Location\nType: Human", "Location", classes) == 0.5
    # triviaqa: first line, best over references.
    assert longbench_score("triviaqa", "Paris\nQuestion: x", ["Lyon", "Paris"]) == 1.0
    assert longbench_score("samsum", "\nAnna is late.\nDialogue: more", ["Anna is late."]) == pytest.approx(1.0)


def test_every_longbench_subset_has_a_metric():
    assert len(LONGBENCH_METRICS) == 21
    assert longbench_score("lsht", "体育", ["体育"], ["财经", "体育"]) == 1.0
    assert longbench_score("passage_count", "2", ["2"]) == 1.0


def test_every_longbench_prediction_is_left_stripped():
    # kvpress strips the left of every prediction: an indented first code line reads as the unindented reference
    assert longbench_score("lcc", "    return x + 1\n", ["return x + 1"]) == 1.0
    assert longbench_score("qasper", "  \n yes", ["yes"]) == 1.0


def test_extract_boxed():
    assert extract_boxed(r"so \boxed{\frac{1}{2}}.") == r"\frac{1}{2}"
    assert extract_boxed(r"\boxed{3} is wrong, the answer is \boxed{ 70 }") == " 70 "  # the last box, as written
    assert extract_boxed("boxed{12}") == "12"  # kvpress looks for "boxed{", with or without the backslash
    assert extract_boxed(r"\boxed{\sqrt{\frac{a}{b}}} and more") == r"\sqrt{\frac{a}{b}}"
    assert extract_boxed(r"I think \boxed{7") is None  # cut off before the box closed
    assert extract_boxed("no answer") is None


def test_aime_correct_is_a_string_match():
    assert aime_correct(r"... \boxed{70}", "70")
    assert aime_correct(r"... \boxed{70}", 70)
    assert not aime_correct(r"... \boxed{070}", "70")  # kvpress compares strings
    assert not aime_correct(r"\boxed{70} then \boxed{71}", "70")
    assert not aime_correct(r"\boxed{ 70 }", "70")  # kvpress does not trim


def test_pass_at_k():
    assert pass_at_k(4, 1, 1) == 0.25
    assert pass_at_k(4, 1, 4) == 1.0
    assert pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # 1 - C(2,2) / C(4,2)
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 4)
