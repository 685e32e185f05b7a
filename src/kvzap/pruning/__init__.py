"""KV cache pruning at inference: scorers, the DMS threshold policy, physical eviction.

KVzapPress(scorer, threshold, window=128, decoding=False, *, evict=True, check_base_model=True, prefill_chunk=None)
    positionally as kvpress's DMSPress(press, threshold, sliding_window_size, decoding):
    scorer     a surrogate folder or Hub id (str: only org/name is looked up on the Hub, a missing folder
               fails at once), or any kvpress ScorerPress (SurrogateScorerPress,
               PrecomputedScorerPress for KVzip/KVzip+ oracle scores, KnormPress, ...): one score per
               (batch, kv-head, token), computed when the token arrives.
    threshold  keep an entry iff its score >= threshold (a log-score, e.g. -4.0; -inf prunes nothing).
    window     the most recent `window` tokens are always kept; each token is judged once, when it leaves.
    decoding   also prune during generation (the AIME setting); False prunes the prefill only (RULER).
    evict      True frees removed entries (PrunedLayer); False masks them in a dense cache (MaskedLayer),
               the kvpress way, kept as the reference: both give the same logits.
    check_base_model  a surrogate records the model it was trained for (config.json `base_model`, or the
               nvidia/KVzap-{kind}-<model> repo name); attaching to another model (its config's
               `kvzap_model_id`, else a Hub-id `name_or_path`) is refused unless this is False.
    prefill_chunk  None prefills in one forward; N prefills N tokens at a time, pruning between chunks.
KVzapLayerFillPress(scorer, threshold, window=128, decoding=False, ...)
    KVzapPress as an engine whose slots hold every KV head of a token serves it (the vLLM plugin): at each
    judgement every head of a layer keeps as many entries as its most-keeping head, the others their next-best.
TopKPerHeadPress(scorer, ratio, window=128, *, evict=True, check_base_model=True, prefill_chunk=None)
TopKPerLayerPress(scorer, ratio, window=128, *, evict=True, check_base_model=True, prefill_chunk=None, safeguard=0.2)
    the paper's fixed-budget ablations (prefill only): each removes `ratio` of the tokens leaving the window, with
    kvpress's budgets (at least one token per head; AdaKV's safeguard per layer): window=0 selects as kvpress does.

Usage (pruning happens after each attention op, in prefill and, with decoding=True, at every step):

    press = KVzapPress("path/or/hub-id/of/surrogate", threshold=-4.0, decoding=True)
    with press(model):
        out = model.generate(input_ids, max_new_tokens=256)      # greedy or sampling
    press.compression_ratio     # fraction of entries removed, mean over layers (kvpress DMSPress's)
    press.layer_ratios, press.head_ratio_table, press.sample_ratios   # (pruned layers,), (.., H), (B,)

    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    pipe(context, question=question, press=KVzapPress(path, threshold=-4.0))   # prefill-only pruning
    # kvpress's pipeline answers after leaving the press's block (it re-enters only its own DMSPress), so there
    # decoding=True is refused; use model.generate for decoding-time pruning.
    with ComposedPress([KVzapPress(path, threshold=-4.0)])(model): ...   # kvpress's wrappers may hold ours alone

Entering the press checks the model (kvzap.pruning.entry: a causal LM, loaded floating-point weights, no
other press active: presses do not nest; a kvpress wrapper may hold one press of ours, kvzap.pruning.wrappers)
and selects the "kvzap" attention implementation; leaving restores
the model, except that "kvzap" stays selected after a block that pruned a cache: pruned caches outlive the
`with` block (the pipeline answers questions after it), and for dense caches it is sdpa. The caller's
surrogate is never cast in place. Padded batches work (left padding, and right padding in plain forwards); beam
search is refused. On hybrid models (Gemma 3, OLMo 3, ...) only the full-attention layers are pruned and counted
in the ratios; sliding-window layers keep transformers' bounded cache (`held_kv_bytes(cache)` counts all).
Forwards with gradients enabled work; a backward through a pruned cache is refused.
Attention over a pruned layer is segment attention (kvzap.pruning.segments): each (batch, kv-head) row's
query heads read only that row's kept entries, so memory and time follow the kept cache.

Under torch.compile, a step over a pruned cache is one graph while every row has spare slots for the tokens that
leave its window; `reserve_room(cache, n)`, called outside the step, makes room for n more (docs/library.md).

Threshold calibration (prefill ratios; one forward per text), from Python with
`kvzap.pruning.calibration.calibrate(collect_scores(model, ids, scorer), targets)` or from the shell:
    python -m kvzap.training.calibrate --model-json M --surrogate S --texts t.json --targets 0.5 0.67 --out tau.json
"""

from kvzap.pruning.cache import MaskedLayer, PrunedLayer, held_kv_bytes, reserve_room
from kvzap.pruning.kvzap_press import KVzapPress
from kvzap.pruning.layer_fill_press import KVzapLayerFillPress
from kvzap.pruning.scorer_presses import PrecomputedScorerPress, SurrogateScorerPress
from kvzap.pruning.topk_presses import TopKPerHeadPress, TopKPerLayerPress

__all__ = [
    "KVzapLayerFillPress",
    "KVzapPress",
    "MaskedLayer",
    "PrecomputedScorerPress",
    "PrunedLayer",
    "SurrogateScorerPress",
    "TopKPerHeadPress",
    "TopKPerLayerPress",
    "held_kv_bytes",
    "reserve_room",
]
