"""KVzip and KVzip+ oracle scores: how much each context token is attended to when the model repeats it.

The prompt is `user: <ctx> Repeat the previous context exactly. assistant: <ctx>` (chat template). The user
turn is prefilled once into a KV cache; the repetition then runs as one or more extra forwards on that cache.
An attention function registered in transformers' attention interface (kvzap.oracle.attention) receives
the queries, keys and values exactly as the model's attention does, scores the repeated tokens' queries in
chunks and then computes the output with the implementation the model was loaded with, so no family's
query path is re-implemented and peak extra memory per layer is O(query_chunk x sequence) instead of the
full (heads x repeat x prompt) attention tensor.

Only the full-attention layers are scored (kvzap.layer_types.pruned_layers): a hybrid model's sliding-window
layers keep their own bounded cache, which KVzap leaves alone, so they are "skipped layers", with no scores and
no surrogate inputs. The forward still runs them as the model does: the cache here is a DynamicCache of full
layers (so it can be cropped between chunks), but transformers builds each sliding layer's window mask from the
config, so a window shorter than the prompt gives the hidden states the model's own sliding cache would.

For a context token i and a query j of its repetition (per query head, softmax over every key j sees):
    KVzip   s_i  = max_j a_ji
    KVzip+  s+_i = max_j a_ji * ||W_O^h v_i|| / ||h_j||        (W_O^h: the o_proj columns of query head h)
then the max over the query heads of each GQA group; KVzip+ is returned as a natural log (the surrogates'
regression target). h is the attention input (post input-RMSNorm), as in kvpress's kvzap/data.py.

Chunked repetition (contexts longer than `chunk_tokens`, 2048 as in kvpress; KVzip itself uses 2000), as
KVzip: chunk k is repeated by its own forward of [user turn][instruction_k][assistant opening][chunk k]
on the cached user turn (the cache is cropped back after each chunk, never recomputed or copied), where
instruction_0 = "Repeat the previous context exactly." and later ones = "Repeat the part of the previous
context exactly, starting with" + the last 8 tokens of chunk k-1. Only chunk k's context tokens are scored
by pass k, by chunk k's repeated tokens. A context of at most `chunk_tokens` tokens is one pass over
exactly the unchunked prompt. Where this differs from kvpress's `KVzipPress`, and why:
- Softmax: kvpress renormalises over a subset of keys ([first 4 sinks, chunk k's context keys, the replay
  tokens]); we use the model's own attention weights (softmax over the whole user turn, the instruction
  and the causal replay), the quantity kvpress's KVzap training data (kvzap/data.py) regresses on.
- Queries: kvpress takes the max over every replay token, instruction and template included; we take it
  over the repeated context tokens only (the paper's j in the repeated prompt, and data.py's rows).
- Sinks and template: kvpress forces the first 4 positions to the maximum score and leaves the rest of the
  template prefix at 0; we score only context tokens and leave sink protection to the pruning policy.
- Masking: kvpress turns the scores into masked keys (no memory saved); this module only scores.
- Precision: kvpress scores in the model dtype; we compute logits, softmax and norms in float32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from kvzap.introspection import decoder
from kvzap.oracle.attention import LayerScorer, check_family, scoring

__all__ = [
    "CHUNK_TOKENS",
    "CONTINUE_INSTRUCTION",
    "CUE_TOKENS",
    "REPEAT_INSTRUCTION",
    "OracleScores",
    "RepeatPrompt",
    "build_repeat_prompt",
    "oracle_scores",
    "repeat_chunks",
]

REPEAT_INSTRUCTION = "\n\nRepeat the previous context exactly."
CONTINUE_INSTRUCTION = "\n\nRepeat the part of the previous context exactly, starting with"
CHUNK_TOKENS = 2048  # kvpress KVzipPress.chunk_size
CUE_TOKENS = 8  # tokens of the previous chunk quoted by a later chunk's instruction (KVzip prev_postfix_size)


@dataclass
class RepeatPrompt:
    input_ids: torch.Tensor  # (1, T)
    context: slice  # token span of the original context
    repeat: slice  # token span of its repetition
    suffix: slice | None = None  # chat-template tokens between the instruction and the repetition
    continue_ids: torch.Tensor | None = None  # (m,) tokens of CONTINUE_INSTRUCTION, for later chunks


@dataclass
class OracleScores:
    """Over the scored (full-attention) layers only, in decoder order: L = len(layers)."""

    layers: list[int]  # decoder layer index of each row
    kvzip: torch.Tensor  # (L, H_kv, C) attention weights in [0, 1]
    kvzip_plus_log: torch.Tensor  # (L, H_kv, C) natural log of KVzip+
    hidden: torch.Tensor | None  # (L, n, D) attention inputs at the requested context positions
    kv: torch.Tensor | None = None  # (L, H_kv, n, 2d) cached [key; value] at those positions, model dtype


CONTEXT_SLOT = "KVZAPCONTEXTSLOT"  # stands in for the context while rendering the chat template


def _slots(context: str) -> tuple[str, str]:
    """Two placeholder strings absent from the context. No whitespace in them, so a template's trim/strip
    cannot touch them, and none of its content checks (e.g. Qwen3's '</think>' split) can fire on them."""
    base = CONTEXT_SLOT
    while base in context:
        base += "X"
    return base + "USER", base + "ASSISTANT"


def _render_around_slots(tokenizer: PreTrainedTokenizerBase, user_slot: str, assistant_slot: str) -> list[str]:
    """The chat-template text split at the two slots: [before user ctx, after it, after assistant ctx]."""
    messages = [
        {"role": "user", "content": user_slot + REPEAT_INSTRUCTION},
        {"role": "assistant", "content": assistant_slot},
    ]
    if tokenizer.chat_template:
        text = tokenizer.apply_chat_template(messages, tokenize=False, enable_thinking=False)
    else:
        text = f"user: {messages[0]['content']}\nassistant: {assistant_slot}"
    if text.count(user_slot) != 1 or text.count(assistant_slot) != 1:
        raise ValueError(
            "The chat template does not render each message's content exactly once; "
            "build_repeat_prompt needs a template that inserts the content as given."
        )
    before, rest = text.split(user_slot)
    between, after = rest.split(assistant_slot)
    if not between.startswith(REPEAT_INSTRUCTION):
        raise ValueError(
            f"The chat template altered the text after the context ({between[:60]!r}); "
            f"expected it to start with the instruction {REPEAT_INSTRUCTION!r}."
        )
    return [before, between, after]


def _special_prefix(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """The ids the tokenizer puts before any text (a base model's BOS: Gemma 3 degrades without it). Read off an
    encoding, not `add_bos_token`, which transformers 5 can report False for a tokenizer that adds one."""
    plain, full = tokenizer("x", add_special_tokens=False)["input_ids"], tokenizer("x")["input_ids"]
    cut = len(full) - len(plain)
    return full[:cut] if cut > 0 and full[cut:] == plain else []


def build_repeat_prompt(tokenizer: PreTrainedTokenizerBase, context: str) -> RepeatPrompt:
    """Render the repeat prompt with the model's chat template; both copies of the context hold exactly
    `tokenizer(context, add_special_tokens=False)`'s ids, whatever the text and the template.

    The template is rendered once around placeholder slots and only its own text is tokenized with it;
    the context is tokenized alone and spliced in, so the spans are known by construction. Two choices
    follow, on purpose:
    - The context goes in verbatim. Templates that rewrite content (Llama-3.1 trims every message, Qwen3
      strips the assistant's leading newlines and splits at '</think>') do not touch it: the oracle scores
      every token of the user's text as the tokenizer splits it on its own (the paper scores the context
      tokens), not a template-rewritten copy whose tokens no surrogate input would match.
    - A tokenizer that starts every text with special ids (a base model's BOS) gets them first, unless the
      template already renders them (Llama-3.1's <|begin_of_text|>).
    - Token boundaries at the context's edges: characters of the context never merge with the template's
      or the instruction's (e.g. 'here.' + '\n\n'), so no context token is lost or shared.
    The instruction and the template text after it are tokenized apart too, so `suffix` (the assistant
    opening) is the same ids before every repeated chunk."""

    def encode(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    context_ids = encode(context)
    if not context_ids:
        raise ValueError(f"The context {context[:40]!r} has no tokens: the oracle needs at least one to score.")
    before, between, after = _render_around_slots(tokenizer, *_slots(context))
    opening, prefix = encode(before), _special_prefix(tokenizer)
    if opening[: len(prefix)] != prefix:  # a base model's BOS, which no chat template rendered
        opening = prefix + opening
    pieces = [
        opening,
        context_ids,
        encode(REPEAT_INSTRUCTION),
        encode(between[len(REPEAT_INSTRUCTION) :]),
        context_ids,
        encode(after),
    ]
    starts = [0]
    for piece in pieces:
        starts.append(starts[-1] + len(piece))
    ctx, suffix, rep = (slice(starts[i], starts[i + 1]) for i in (1, 3, 4))
    continue_ids = torch.tensor(encode(CONTINUE_INSTRUCTION))
    return RepeatPrompt(torch.tensor([sum(pieces, [])]), ctx, rep, suffix, continue_ids)


def repeat_chunks(
    prompt: RepeatPrompt, chunk_tokens: int | None = CHUNK_TOKENS
) -> list[tuple[torch.Tensor, slice, int]]:
    """The forwards that follow the cached user turn (ids[:context.stop]): (input ids (n,), the context
    positions they score, how many trailing ids repeat them). A single chunk is the unchunked prompt's
    tail; several follow KVzip's chunk prompts."""
    ids, ctx, rep = prompt.input_ids[0], prompt.context, prompt.repeat
    n_ctx = ctx.stop - ctx.start
    if chunk_tokens is None or n_ctx <= chunk_tokens:
        return [(ids[ctx.stop : rep.stop], ctx, rep.stop - rep.start)]
    if prompt.suffix is None or prompt.continue_ids is None:
        raise ValueError("Chunked repetition needs a RepeatPrompt from build_repeat_prompt (suffix, continue_ids).")
    context_ids = ids[ctx]
    chunks = []
    for start in range(0, n_ctx, chunk_tokens):
        piece = context_ids[start : start + chunk_tokens]
        if start == 0:
            lead = ids[ctx.stop : rep.start]
        else:
            lead = torch.cat([prompt.continue_ids, context_ids[start - CUE_TOKENS : start], ids[prompt.suffix]])
        chunks.append((torch.cat([lead, piece]), slice(ctx.start + start, ctx.start + start + len(piece)), len(piece)))
    return chunks


@torch.no_grad()
def oracle_scores(
    model: PreTrainedModel,
    prompt: RepeatPrompt,
    keep_positions: torch.Tensor | None = None,
    query_chunk: int = 256,
    chunk_tokens: int | None = CHUNK_TOKENS,
    keep_kv: bool = False,
) -> OracleScores:
    """Score every (full-attention layer, kv-head, context token); optionally keep the attention inputs at
    `keep_positions` (indices into the context span), which are the surrogate's training inputs, and with `keep_kv`
    the cached keys and values there (the inputs of the paper's (k, v) surrogate ablation). `chunk_tokens=None`
    repeats the whole context in one forward (kvpress's data.py definition) whatever its length."""
    if keep_kv and keep_positions is None:
        raise ValueError("keep_kv=True needs keep_positions: the keys and values are kept at those context positions.")
    check_family(model)
    ids, ctx = prompt.input_ids, prompt.context
    chunks = repeat_chunks(prompt, chunk_tokens)
    scorer = LayerScorer(model, ctx, query_chunk, keep_positions, keep_kv)
    device = next(model.parameters()).device
    cache = DynamicCache()  # full layers whatever the config, so crop() applies; sliding layers' masks keep the window
    with scoring(model, scorer):
        decoder(model)(input_ids=ids[:, : ctx.stop].to(device), past_key_values=cache, use_cache=True)
        for chunk_ids, scorer.scored, scorer.n_repeat in chunks:
            decoder(model)(input_ids=chunk_ids[None].to(device), past_key_values=cache, use_cache=True)
            cache.crop(ctx.stop)
    layers = scorer.layers
    if any(i not in scorer.kvzip for i in layers):
        raise NotImplementedError(
            f"The KVzap oracle cannot score {model.config.model_type} models: some attention layers never called "
            "transformers' attention function."
        )
    return OracleScores(
        layers=list(layers),
        kvzip=torch.stack([scorer.kvzip[i] for i in layers]),
        kvzip_plus_log=torch.stack([scorer.plus_log[i] for i in layers]),
        hidden=torch.stack([scorer.hidden[i] for i in layers]) if keep_positions is not None else None,
        kv=torch.stack([scorer.kv[i] for i in layers]) if keep_kv else None,
    )
