"""kvpress's presses around ours: which press holds which, and whether a layer's presses run ours as it needs.

kvpress's wrappers (ComposedPress, PrefillDecodingPress, DMSPress, AdaKVPress, ...) hold a press in an attribute
(`presses`, `prefilling_press`, `press`, ...) and call it from their own hook, so a layer's hooks name the wrapper,
not the press it holds. A pruned cache is ours alone: two presses would judge the same tokens under two rules, and
kvpress's presses read dense layers only. So a KVzap press runs where the layer's one active press is itself, or a
wrapper that holds it alone and calls its hook on every forward it is asked to judge. kvpress's pipeline is named
too: it answers after leaving the press's block, so no press of ours can prune while it decodes there.
"""

from __future__ import annotations

import sys

from kvpress.pipeline import KVPressTextGenerationPipeline
from kvpress.presses.base_press import BasePress
from kvpress.presses.prefill_decoding_press import PrefillDecodingPress

from kvzap.pruning.entry import active_presses


def held_presses(outer) -> list[BasePress]:
    """The presses `outer` holds directly: its attributes that are presses, or lists / tuples of them."""
    found = []
    for value in getattr(outer, "__dict__", {}).values():
        for item in value if isinstance(value, (list, tuple)) else (value,):
            if isinstance(item, BasePress) and item is not outer:
                found.append(item)
    return found


def path_to(outer, press) -> list:
    """The presses from `outer` down to `press` ([outer, ..., press]); [] if `outer` does not hold `press`."""
    if outer is press:
        return [press]
    for inner in held_presses(outer):
        below = path_to(inner, press)
        if below:
            return [outer, *below]
    return []


def companions(outer, press) -> list[BasePress]:
    """What `outer` holds beside `press`: the topmost press of each branch off the path down to it."""
    found = []
    for inner in held_presses(outer):
        if inner is press:
            continue
        found.extend(companions(inner, press) if path_to(inner, press) else [inner])
    return found


def holders(press, module) -> list[BasePress]:
    """The presses hooked on `module` that hold `press` (kvpress wrappers around it)."""
    return [p for p in active_presses([module]) if p is not press and path_to(p, press)]


def caller_name(press, module) -> str:
    """The wrapper calling `press` on `module`, for messages; "the caller" if no hooked press holds it."""
    outer = holders(press, module)
    return type(outer[0]).__name__ if outer else "the caller"


def entered_by_kvpress_pipeline() -> bool:
    """Whether kvpress's pipeline ("kv-press-text-generation") is entering the press: its `_forward`, which prefills
    the context inside the press's block and answers after leaving it, is on the call stack."""
    code = KVPressTextGenerationPipeline._forward.__code__
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code:
            return True
        frame = frame.f_back
    return False


def refuse_pipeline_decoding(press) -> None:
    """Raise if a press asked to prune while decoding is entered by kvpress's pipeline, which would not let it."""
    if getattr(press, "decoding", False) and entered_by_kvpress_pipeline():
        name = type(press).__name__
        raise ValueError(
            f"{name}(decoding=True) under kvpress's pipeline: the pipeline prunes the context inside the press's "
            "block and answers after leaving it (it re-enters only kvpress's DMSPress and decoding presses), so the "
            f"answer's tokens would not be judged. Fix: for pruning while decoding, run model.generate inside "
            f"`with press(model):`; under the pipeline, pass {name}(..., decoding=False) (the context is pruned)."
        )


def check_company(press, module, entered: bool) -> None:
    """Raise, naming the presses and the fix, unless `module`'s one active press is `press` (`entered`: through its
    own `with` block) or a wrapper that holds it alone and calls it wherever `press` is meant to prune."""
    holder = _sole_holder(press, module, entered)
    if holder is not None:
        _refuse_dropped_settings(press, holder)


def _sole_holder(press, module, entered: bool):
    """The wrapper through which `press` runs on `module` (None: it runs by itself); raise if another press is
    active there, or `press` would run twice, or beside another press."""
    name = type(press).__name__
    active = [p for p in active_presses([module]) if p is not press]
    holding = [p for p in active if path_to(p, press)]
    others = [p for p in active if not path_to(p, press)]
    if others:
        block = f"{name}'s block" if entered or not holding else f"{type(holding[0]).__name__}'s block"
        raise RuntimeError(
            f"{type(others[0]).__name__} was entered inside {block}: presses do not nest, so use one press at a time."
        )
    if not holding:
        return None
    outer = type(holding[0]).__name__
    if entered or len(holding) > 1:
        twice = f"{name} is also entered by itself" if entered else f"{type(holding[1]).__name__} holds it too"
        raise RuntimeError(
            f"{outer} holds {name} and {twice}: its hook would run twice per forward; enter one of them."
        )
    beside = companions(holding[0], press)
    if beside:
        raise RuntimeError(
            f"{outer} holds {name} with {type(beside[0]).__name__}: {name} prunes the cache into layers that no other "
            f"press reads (and a press before it would hide the prefill from it), so compose {name} alone, or use "
            "one press at a time."
        )
    return holding[0]


def _refuse_dropped_settings(press, holder) -> None:
    """Raise if `holder` would not let `press` do what its settings ask: prune while decoding, chunk the prefill."""
    name = type(press).__name__
    path = path_to(holder, press)
    for step, inner in zip(path, path[1:]):
        if isinstance(step, PrefillDecodingPress) and inner is step.decoding_press:
            raise RuntimeError(
                f"PrefillDecodingPress calls its decoding_press after the prefill only, and {name} judges tokens "
                f"from the prefill on: use {name}(..., decoding=True) itself."
            )
        if isinstance(step, PrefillDecodingPress) and getattr(press, "decoding", False):
            raise RuntimeError(
                f"PrefillDecodingPress calls its prefilling_press at the prefill only, so {name}(decoding=True) "
                f"would not prune while decoding: use {name} itself (it prunes while decoding), or decoding=False."
            )
    if getattr(press, "prefill_chunk", None) is not None:
        raise RuntimeError(
            f"{type(holder).__name__} enters {name}'s hooks but not its `with` block, which is where prefill_chunk="
            f"{press.prefill_chunk} splits the prefill: use {name} by itself, or prefill_chunk=None."
        )


def not_a_scorer(press, module) -> str:
    """The message for a wrapper that uses a whole press of ours (one that judges tokens) as a ScorerPress."""
    name, outer = type(press).__name__, caller_name(press, module)
    same = " (KVzapPress takes DMSPress's arguments and frees what it prunes)" if outer == "DMSPress" else ""
    return (
        f"{outer} uses {name} as a ScorerPress, but {name} is a whole press: it scores tokens with its scorer and "
        f"judges them itself. Use {name} by itself{same} or inside ComposedPress, or give {outer} its scorer: "
        f"{outer}(press={name}(...).scorer, ...)."
    )
