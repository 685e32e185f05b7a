"""kvpress's own tests (its sdist's tests/, at the kvpress version installed), imported unchanged, and the fixtures
they ask for, built offline.

`make setup-test` unpacks the sdist's `tests/` folder into .cache/kvpress-sdist (tests/kvpress_reference.py). Its
modules import their fixtures as `tests.fixtures` and `tests.default_presses`; they are imported here under a private
package name, with those two names pointing into it while they load (this repository's tests/ is not a package).

Their fixtures load Hub models; `unit_test_model` here is a random Llama of the shape of theirs
(maxjeblick/llama2-0b-unit-test: 2 layers, 2 KV heads of dimension 6, a 32000-token vocabulary), saved with a word
tokenizer that splits their texts as Llama-2's does (the test article is 23 tokens with BOS), so the counts their
checks assert hold for the same reasons. Two properties their checks take from their model are given to its weights:
- its greedy answer hardly depends on which context tokens a press removes (attention writes little to the residual
  stream: o_proj scaled by ATTENTION_OUT), which test_generate needs: it compares the pipeline, which prunes the
  context, with model.generate, which prunes the context and the "\n" after it (other tokens for every press);
- the queries of a forward share a direction (a q_proj bias, QUERY_BIAS, on the slowest-turning rotary pair), which
  kvpress's masking needs to hide an entry from a question of several tokens (attention_patch.search_hyperplane
  looks for a key that every query of a KV group sees at -inf; random queries in 6 dimensions rarely allow one).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, pipeline

from kvpress_reference import SDIST, private_package

PACKAGE = "kvpress_reference_tests"
ALIASED = ("fixtures", "default_presses")  # what their modules import as tests.<name>
VOCAB = 32000
ATTENTION_OUT = 0.01
QUERY_BIAS = 1.0
WORDS = (
    "This is a test article . It was written on When was this article written ? The quick brown fox jumps over the "
    "lazy dog What animal jumps over the dog the best KV cache compression library in world Repeat last sentence"
).split()


def _suite_dir() -> Path:
    folder = SDIST / "tests"
    if not (folder / "fixtures.py").is_file():
        raise FileNotFoundError(
            f"kvpress's tests are missing from {folder}: run `rm -r {SDIST} && make setup-test` (it unpacks the "
            "sdist's evaluation/, kvzap/ and tests/ folders)."
        )
    return folder


def module(name: str):
    """A module of kvpress's tests/ package, e.g. "presses.test_presses"."""
    private_package(PACKAGE, _suite_dir)
    full = f"{PACKAGE}.{name}"
    if full in sys.modules:
        return sys.modules[full]
    saved = {alias: sys.modules.get(f"tests.{alias}") for alias in ALIASED}
    try:
        for alias in ALIASED:
            sys.modules[f"tests.{alias}"] = importlib.import_module(f"{PACKAGE}.{alias}")
        return importlib.import_module(full)
    finally:
        for alias, before in saved.items():
            if before is None:
                sys.modules.pop(f"tests.{alias}", None)
            else:
                sys.modules[f"tests.{alias}"] = before


def check_names(name: str) -> list[str]:
    """The test functions of one of their modules, as pytest would name them (Class::test for methods)."""
    found = []
    for key, value in vars(module(name)).items():
        if key.startswith("test_") and callable(value):
            found.append(key)
        elif key.startswith("Test") and isinstance(value, type):
            found += [f"{key}::{m}" for m in vars(value) if m.startswith("test_")]
    return found


def parametrized(test, argname: str) -> list:
    """The values their `@pytest.mark.parametrize(argname, ...)` gives `test`."""
    for mark in getattr(test, "pytestmark", []):
        if mark.name == "parametrize" and mark.args[0] == argname:
            return list(mark.args[1])
    raise LookupError(f"{test.__name__} is not parametrized over {argname}")


def word_tokenizer() -> PreTrainedTokenizerFast:
    """Words with Llama-2's leading "▁", digits and punctuation one token each, BOS first; the rest of the vocabulary
    is filler that decodes to itself, so any generated id decodes and a decoding is the concatenation of its parts."""
    specials = ["<unk>", "<s>", "</s>", "\n"]
    words = list(dict.fromkeys([w for w in WORDS] + [f"▁{w}" for w in WORDS] + ["▁", *"0123456789", "-", ".", "?"]))
    vocab = {token: i for i, token in enumerate(specials + words)}
    vocab.update({f"<{i}>": i for i in range(len(vocab), VOCAB)})
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="never"),
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.Split(Regex(r"[.?\-\n]"), behavior="isolated"),
        ]
    )
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="never")
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>", clean_up_tokenization_spaces=False
    )


def save_unit_test_folder(folder: Path) -> Path:
    """The tokenizer and config of `unit_test_model`, where `AutoTokenizer.from_pretrained(name_or_path)` finds them."""
    word_tokenizer().save_pretrained(folder)
    _config().save_pretrained(folder)
    return folder


def _config() -> LlamaConfig:
    return LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=24,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=6,
        max_position_embeddings=2048,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=None,
        attention_bias=True,
    )


def unit_test_model(folder: Path) -> LlamaForCausalLM:
    """A fresh random model of the unit-test shape, named by `folder` (as their fixture's is by its Hub id)."""
    torch.manual_seed(0)
    config = _config()
    config._attn_implementation = "sdpa"
    model = LlamaForCausalLM(config).eval()
    model.config._name_or_path = str(folder)
    with torch.no_grad():
        for layer in model.model.layers:
            attention = layer.self_attn
            attention.o_proj.weight.mul_(ATTENTION_OUT)
            bias = attention.q_proj.bias.view(config.num_attention_heads, config.head_dim)
            bias[:, config.head_dim // 2 - 1] = QUERY_BIAS  # rotary pair (d/2 - 1, d - 1) turns slowest
    return model


def unit_test_pipeline(model):
    tokenizer = PreTrainedTokenizerFast.from_pretrained(model.config.name_or_path)
    return pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer, device="cpu")


class CompressView:
    """A fixed-budget press of ours in kvpress's compress form, for kvpress's compress-level checks (they call
    `press.compress(module, hidden_states, keys, values, attentions, kwargs)` on a stand-in module): the verdict its
    hook gives a prefill at window 0, where every token leaves the window at once (`select` on its scorer's scores),
    returned as its kvpress counterpart returns one: TopKPerHeadPress's kept keys and values (ScorerPress.compress),
    TopKPerLayerPress's removed entries in module.masked_key_indices (AdaKVPress)."""

    def __init__(self, press):
        if press.window != 0:
            raise ValueError(f"CompressView shows a prefill's verdict at window 0, got window={press.window}")
        self.press = press

    def compress(self, module, hidden_states, keys, values, attentions, kwargs):
        keep = self.press.select(self.press.scorer.score(module, hidden_states, keys, values, attentions, kwargs))
        if type(self.press).__name__ == "TopKPerLayerPress":
            module.masked_key_indices = (~keep).nonzero(as_tuple=True)
            return keys, values
        index = keep.nonzero()[:, -1].view(*keep.shape[:2], -1, 1).expand(-1, -1, -1, keys.shape[-1])
        return keys.gather(2, index), values.gather(2, index)
