"""A bank of predictions built to reach the scorers' edges: each base answer (right, partly right, wrong, empty) in
every decoration a model's output can take (whitespace and newlines before and after, several lines, case,
punctuation, articles, control characters, a cut-off end), per task, for RULER, LongBench and AIME."""

from __future__ import annotations

from dataclasses import dataclass, field

# How a generation can surround or garble an answer.
DECORATIONS = {
    "as is": lambda p: p,
    "leading spaces": lambda p: "   " + p,
    "leading newline": lambda p: "\n" + p,
    "spaces then newline": lambda p: "  \n" + p,
    "newlines and tab": lambda p: "\n\n\t" + p,
    "crlf": lambda p: "\r\n" + p + "\r\n",
    "trailing newline": lambda p: p + "\n",
    "second line": lambda p: p + "\nQuestion: and another one?",
    "answer on line two": lambda p: "Sure.\n" + p,
    "upper": str.upper,
    "lower": str.lower,
    "full stop": lambda p: p + ".",
    "quoted": lambda p: f'"{p}"',
    "article": lambda p: "The " + p,
    "sentence": lambda p: f"I think the answer is {p}, clearly.",
    "nul inside": lambda p: p[: len(p) // 2] + "\x00" + p[len(p) // 2 :],
    "newline inside": lambda p: p[: len(p) // 2] + "\n" + p[len(p) // 2 :],
    "bell first": lambda p: "\x07" + p,
    "cut off": lambda p: p[: max(1, len(p) * 2 // 3)],
    "repeated": lambda p: f"{p} {p}",
}


@dataclass(frozen=True)
class Case:
    task: str
    prediction: str
    references: tuple[str, ...]
    all_classes: tuple[str, ...] = field(default=())


def _decorated(task: str, bases: list[str], references: list[str], classes: list[str] = ()) -> list[Case]:
    return [
        Case(task, decorate(base), tuple(references), tuple(classes))
        for base in bases
        for decorate in DECORATIONS.values()
    ]


# ------------------------------------------------------------------------------------------------------- RULER

RULER_ANSWERS = {
    "niah_single_1": ["8123456"],
    "niah_single_2": ["4417290"],
    "niah_single_3": ["a1b2c3d4-e5f6-4a7b-8c9d-0e1f2a3b4c5d"],
    "niah_multikey_1": ["7010203"],
    "niah_multikey_2": ["1234567"],
    "niah_multikey_3": ["0f9e8d7c-6b5a-4c3d-2e1f-0a9b8c7d6e5f"],
    "niah_multivalue": ["1111111", "2222222", "3333333", "4444444"],
    "niah_multiquery": ["5551234", "5559876"],
    "vt": ["XKQZP", "ABCDE", "MNOPQ"],
    "cwe": ["apple", "banana", "cherry", "date", "elder", "fig", "grape", "honeydew", "kiwi", "lemon"],
    "fwe": ["qwerty", "asdfgh", "zxcvbn"],
    "qa_1": ["Paris", "the city of Paris"],
    "qa_2": ["Marie Curie"],
}


def ruler_cases() -> list[Case]:
    cases = []
    for task, answers in RULER_ANSWERS.items():
        bases = [", ".join(answers), " ".join(reversed(answers)), answers[0], "\n".join(answers), "none of them", ""]
        cases += _decorated(task, bases, answers)
    return cases


# --------------------------------------------------------------------------------------------------- LongBench

# Each list holds two strict parts of a reference in a row ("capital", "city" / "体育", "新闻"), where LongBench's loop
# skips the second (tests/test_kvpress_reference.py tests the departure that fixes it).
TREC_CLASSES = ["City", "Country", "Other location", "Individual", "Description of a person", "Title of a person",
                "Number of something", "Date", "Location", "capital", "city", "capital city"]  # fmt: skip
LSHT_CLASSES = ["体育", "新闻", "财经", "科技", "教育", "天气", "体育新闻"]
CODE_REFERENCE = "return self.value + 1"


def _code_bases() -> list[str]:
    return [
        CODE_REFERENCE,
        "    " + CODE_REFERENCE + "\n    # done",
        "```python\n" + CODE_REFERENCE + "\n```",
        "# add one\n" + CODE_REFERENCE,
        "// a comment\n" + CODE_REFERENCE + "  // inline",
        "\n\n" + CODE_REFERENCE + "\nprint(x)",
        "\t\treturn self.value + 2",
        "x = `backtick`\nreturn self.value",
        "",
    ]


LONGBENCH_REFERENCES = {
    "narrativeqa": (
        ["Edward Ferrars", "Edward"],
        ["Edward Ferrars", "He marries Edward.", "the colonel", "Ferrars, Edward!"],
    ),
    "qasper": (["unanswerable", "yes"], ["Yes", "unanswerable", "No, it does not.", "yes, with BERT"]),
    "multifieldqa_en": (["in 1998"], ["1998", "In the year 1998.", "an unknown year"]),
    "hotpotqa": (["the Eiffel Tower"], ["Eiffel Tower", "The Eiffel Tower in Paris", "a tower"]),
    "2wikimqa": (["Jane Austen"], ["Jane Austen", "austen", "Charlotte Brontë"]),
    "musique": (["1066"], ["1066", "In 1066 AD", "1067"]),
    "triviaqa": (["Mount Everest", "Everest"], ["Mount Everest", "Everest\nAnswer: K2", "K2"]),
    "gov_report": (
        ["The report reviews federal spending on roads and bridges in 2019."],
        ["The report reviews federal spending on roads.", "Spending on bridges rose in 2019.", "Unrelated text."],
    ),
    "qmsum": (
        ["The team agreed to ship the remote control in May."],
        ["They agreed to ship it in May.", "No agreement."],
    ),
    "multi_news": (
        ["Storms hit the coast, closing schools."],
        ["Storms closed schools on the coast.", "Markets rose."],
    ),
    "samsum": (
        ["Anna will be late for dinner."],
        ["Anna is late.", "Anna will be late for dinner.\nDialogue: Tom: ok"],
    ),
    "multifieldqa_zh": (["北方的一个小镇"], ["北方的一个小镇", "在北方的小镇。", "上海"]),
    "dureader": (["图书馆早上八点开门。"], ["图书馆每天早上八点开门", "晚上十点"]),
    "vcsum": (["会议决定下个月试行新的排班制度。"], ["会议决定试行新的排班制度", "没有决定"]),
    "passage_count": (["4"], ["4", "There are 4 unique paragraphs.", "4, 5 or 6", "four", "04", "14"]),
    "passage_retrieval_en": (
        ["Paragraph 3"],
        ["Paragraph 3", "paragraph 3", "Paragraph 3 and Paragraph 13", "3", "P3"],
    ),
    "passage_retrieval_zh": (["段落3"], ["段落3", "答案是段落3和段落5", "第三段", "3"]),
    "lcc": ([CODE_REFERENCE], _code_bases()),
    "repobench-p": ([CODE_REFERENCE], _code_bases()),
}
CLASSIFICATION = {
    "trec": (
        ["capital city", "City"],
        TREC_CLASSES,
        ["City", "capital city", "Location: City", "capital", "Individual"],
    ),
    "lsht": (["体育新闻", "科技"], LSHT_CLASSES, ["体育新闻", "体育", "科技", "类别：财经", "天气和体育"]),
}


def longbench_cases() -> list[Case]:
    cases = []
    for task, (references, bases) in LONGBENCH_REFERENCES.items():
        cases += _decorated(task, bases + [""], references)
    for task, (references, classes, bases) in CLASSIFICATION.items():
        for reference in references:  # one reference each, as LongBench's classification rows have
            cases += _decorated(task, bases + [""], [reference], classes)
    return cases


# -------------------------------------------------------------------------------------------------------- AIME

AIME_BASES = [
    "\\boxed{70}",
    "so the answer is $\\boxed{70}$.",
    "\\boxed{ 70 }",
    "boxed{70}",
    "\\boxed{070}",
    "\\boxed{\\text{70}}",
    "\\boxed{{70}}",
    "\\boxed{3} is wrong; the answer is \\boxed{70}",
    "\\boxed{70} and then \\boxed{71}",
    "\\boxed{7",
    "\\fbox{70}",
    "The answer is 70",
    "70",
    "\\boxed{\\frac{140}{2}}",
    "\\boxed{70}}",
    "\\boxed{}",
    "<think>\\boxed{12}</think> Final: \\boxed{70}",
    "",
]


def aime_cases() -> list[Case]:
    return [
        case
        for answer in ("70", "7", "0")
        for case in _decorated("aime25", [b.replace("70", answer) for b in AIME_BASES], [answer])
    ]
