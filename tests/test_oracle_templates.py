"""build_repeat_prompt with the real Qwen3 / Llama-3.1 chat templates (and the tiny CHATML one) on texts
that templates rewrite or that merge with the instruction: both context copies must hold exactly the plain
tokenization of the context, and the oracle must score them, chunked or not."""

from pathlib import Path

import pytest
import torch
from tokenizers import processors
from transformers import AutoTokenizer

from kvzap.oracle.scores import (
    CONTINUE_INSTRUCTION,
    CUE_TOKENS,
    REPEAT_INSTRUCTION,
    RepeatPrompt,
    build_repeat_prompt,
    oracle_scores,
)
from oracle_reference import reference_scores
from tiny_models import tiny_model, tiny_tokenizer

TOKENIZERS = Path(__file__).resolve().parents[1] / ".cache" / "tokenizers"

# Each template's rendering of [user: c + instruction, assistant: c], written out by hand for an untouched c:
# (text before the user's context, the assistant opening after the instruction, text after the repetition).
TEMPLATES = {
    "qwen3": ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", "<|im_end|>\n"),
    "llama3_1": (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n",
        "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n",
        "<|eot_id|>",
    ),
    "chatml": ("<|im_start|>user\n", "<|im_end|>\n<|im_start|>assistant\n", "<|im_end|>\n"),
    "none": ("user: ", "\nassistant: ", ""),
}

CONTEXTS = {
    "leading_space": " starts with a space",
    "trailing_newline": "ends with a newline\n",
    "both_edges": "  \n padded on both sides \t\n\n",
    "leading_newlines": "\n\nstarts with blank lines",
    "merges_with_instruction": "The answer is over here.",
    "one_token_letter": "A",
    "one_token_word": "the",
    "one_token_instruction_word": "Repeat",
    "one_token_period": ".",
    "cjk": "東京は日本の首都です。人口は約1400万人。",
    "emoji": "Great job 👍🏽🎉 see you 🚀",
    "accents": "Café naïve Ångström über façade",
    "code_tabs": "def f(x):\n\tif x:\n\t\treturn x\t# tab\n",
    "holds_instruction": "Repeat the previous context exactly.\n\nRepeat the previous context exactly.",
    "holds_chatml_tokens": "a <|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n b",
    "holds_llama_tokens": "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\nx",
    "holds_placeholder": "KVZAPCONTEXTSLOTUSER and KVZAPCONTEXTSLOTASSISTANT",
}


def load_tokenizer(name: str):
    if name in ("chatml", "none"):
        tok = tiny_tokenizer()
        if name == "none":
            tok.chat_template = None
        return tok
    return AutoTokenizer.from_pretrained(TOKENIZERS / name)


@pytest.fixture(scope="module", params=list(TEMPLATES))
def template(request):
    return request.param, load_tokenizer(request.param)


def decode(tok, ids) -> str:
    return tok.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


@pytest.mark.parametrize("context", list(CONTEXTS.values()), ids=list(CONTEXTS))
def test_spans_hold_the_plain_tokenization_and_the_prompt_reads_right(template, context):
    name, tok = template
    prompt = build_repeat_prompt(tok, context)
    ids = prompt.input_ids[0].tolist()
    plain = tok(context, add_special_tokens=False)["input_ids"]
    assert ids[prompt.context] == plain and ids[prompt.repeat] == plain
    before, opening, after = TEMPLATES[name]
    assert decode(tok, ids) == before + context + REPEAT_INSTRUCTION + opening + context + after
    assert decode(tok, ids[: prompt.context.stop]) == before + context  # the user turn: context ...
    assert decode(tok, ids[prompt.context.stop : prompt.suffix.start]) == REPEAT_INSTRUCTION  # ... + instruction
    assert decode(tok, ids[prompt.suffix]) == opening and prompt.suffix.stop == prompt.repeat.start
    assert prompt.continue_ids.tolist() == tok(CONTINUE_INSTRUCTION, add_special_tokens=False)["input_ids"]


def test_a_base_model_prompt_starts_with_its_bos_once():
    """No chat template and a tokenizer that adds a BOS (Gemma 3's base model): the prompt starts with it, the
    spans are unchanged; a template that renders the BOS itself (Llama-3.1) keeps exactly one."""
    tok = tiny_tokenizer()
    tok.chat_template = None
    bos = tok.convert_tokens_to_ids("<|im_start|>")
    tok._tokenizer.post_processor = processors.TemplateProcessing(
        single="<|im_start|> $A", special_tokens=[("<|im_start|>", bos)]
    )
    context = "a base model repeats this"
    prompt = build_repeat_prompt(tok, context)
    ids = prompt.input_ids[0].tolist()
    plain = tok(context, add_special_tokens=False)["input_ids"]
    assert ids[0] == bos and ids.count(bos) == 1
    assert ids[prompt.context] == plain and ids[prompt.repeat] == plain
    assert decode(tok, ids[1 : prompt.context.start]) == "user: "
    llama = load_tokenizer("llama3_1")
    assert build_repeat_prompt(llama, context).input_ids[0].tolist().count(llama.bos_token_id) == 1


def test_context_without_tokens_is_refused():
    with pytest.raises(ValueError, match="no tokens"):
        build_repeat_prompt(tiny_tokenizer(), "")


@pytest.mark.parametrize("rewrite,error", [("lower", "exactly once"), ("upper", "altered the text after the context")])
def test_template_that_rewrites_content_is_named(rewrite, error):
    tok = tiny_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m['content'] | " + rewrite + " }}{% endfor %}"
    with pytest.raises(ValueError, match=error):
        build_repeat_prompt(tok, "some context")


EDGE_TEXT = "".join(
    CONTEXTS[k]
    for k in (
        "leading_newlines",
        "cjk",
        "code_tabs",
        "holds_instruction",
        "emoji",
        "merges_with_instruction",
        "trailing_newline",
    )
)


def chunk_prompts(tok, name: str, prompt: RepeatPrompt, chunk: int) -> list[RepeatPrompt]:
    """KVzip's chunk prompts as whole sequences, from the instruction texts and the hand-written opening."""
    ids, ctx = prompt.input_ids[0].tolist(), prompt.context

    def encode(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    opening = encode(TEMPLATES[name][1])
    context = ids[ctx]
    out = []
    for start in range(0, len(context), chunk):
        piece = context[start : start + chunk]
        cue = context[start - CUE_TOKENS : start]
        instruction = encode(REPEAT_INSTRUCTION) if start == 0 else encode(CONTINUE_INSTRUCTION) + cue
        seq = ids[: ctx.stop] + instruction + opening + piece
        out.append(
            RepeatPrompt(
                torch.tensor([seq]),
                slice(ctx.start + start, ctx.start + start + len(piece)),
                slice(len(seq) - len(piece), len(seq)),
            )
        )
    return out


@pytest.mark.parametrize("name,family", [("qwen3", "qwen3"), ("llama3_1", "llama")])
@pytest.mark.parametrize("chunk", [None, 16])
def test_oracle_on_real_templates_matches_plain_computation(name, family, chunk):
    tok = load_tokenizer(name)
    prompt = build_repeat_prompt(tok, EDGE_TEXT)
    n_ctx = prompt.context.stop - prompt.context.start
    assert n_ctx > 2 * 16  # several chunks, the last one partial or not
    model = tiny_model(family, vocab_size=len(tok))
    ours = oracle_scores(model, prompt, query_chunk=8, chunk_tokens=chunk)
    model.config._attn_implementation = "eager"
    for part in chunk_prompts(tok, name, prompt, chunk or n_ctx):
        ref_kvzip, ref_plus = reference_scores(model, part)
        local = slice(part.context.start - prompt.context.start, part.context.stop - prompt.context.start)
        torch.testing.assert_close(ours.kvzip[..., local], ref_kvzip, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(ours.kvzip_plus_log[..., local], ref_plus, atol=1e-5, rtol=1e-5)
