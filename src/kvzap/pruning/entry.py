"""What entering a press checks and what leaving it restores: a press only borrows the model.

Entry refuses, before anything on the model changes, what would otherwise fail deep inside a forward or prune
silently wrong: something that is not a causal LM, weights not loaded (meta) or not floating point, and a
press already active on the model (presses do not nest: two hooks would judge the same tokens under two
rules). The cache is only known at the first forward, where the press prunes the full-attention layers of a
DynamicCache (a hybrid model's sliding-window layers keep their own bounded cache, kvzap.layer_types), and checks
the presses hooked there (kvzap.pruning.wrappers: a kvpress wrapper such as ComposedPress may hold ours).
Leaving restores what kvpress's `BasePress` and the "kvzap" attention changed: the attention implementation (if the
block left a pruned cache, which only that implementation can read, for the forwards that ask for attention weights
over none) and the `rotary_emb` attribute kvpress puts on every attention module. A press entered by a kvpress
wrapper has no block of its own to leave: it hands the attention back as a block that left a pruned cache does.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvpress.presses.base_press import BasePress
from transformers import PreTrainedModel

from kvzap.introspection import decoder
from kvzap.pruning.attention import NAME
from kvzap.pruning.cache import JudgedLayer


def press_hooked_modules(model: PreTrainedModel) -> list:
    """The attention module of each decoder layer that kvpress hooks (`self_attn`); the oracle finds its modules
    under any of their names (kvzap.introspection.attention_modules)."""
    return [layer.self_attn for layer in decoder(model).layers]


def _layers(model):
    """The decoder layers of a causal LM; None for anything else, the decoder itself included (no LM head)."""
    try:
        inner = decoder(model)
        return None if inner is model else inner.layers
    except AttributeError:
        return None


def active_presses(modules) -> list[BasePress]:
    """kvpress presses (ours included) whose hook is on any of `modules`: the presses active on the model."""
    found = []
    for module in modules:
        for hook in module._forward_hooks.values():
            owner = getattr(hook, "__self__", None)
            if isinstance(owner, BasePress) and all(owner is not p for p in found):
                found.append(owner)
    return found


def check_model(press: BasePress, model, wrapped: bool = False) -> None:
    """Raise, naming the value and the fix, if `press` cannot be entered on `model` (`wrapped`: by a kvpress wrapper
    that holds it)."""
    name = type(press).__name__
    if not isinstance(model, PreTrainedModel) or _layers(model) is None:
        raise TypeError(
            f"{name}(model) takes a transformers causal LM (e.g. AutoModelForCausalLM.from_pretrained(...)), got "
            f"{type(model).__name__}: pass the model that has .model.layers, not its decoder or a pipeline."
        )
    dtype = next(model.parameters()).dtype
    if any(p.is_meta for p in model.parameters()):
        raise ValueError(f"{name}: the model's weights are on the meta device (not loaded): load them first.")
    if not dtype.is_floating_point:
        raise TypeError(f"{name}: the model's weights are {dtype}; presses run float16, bfloat16 or float32 models.")
    others = active_presses(press_hooked_modules(model))
    if others:
        raise RuntimeError(
            f"{type(others[0]).__name__} is already active on this model: presses do not nest, so leave its "
            f"`with` block before entering {'a press that holds ' if wrapped else ''}{name} (or use one press)."
        )


def borrow_attention(model: PreTrainedModel) -> None:
    """Select the "kvzap" attention for a press that a kvpress wrapper enters: nothing restores the model when the
    wrapper's block ends, so the model's own implementation is handed back at once, as after a block that left a
    pruned cache (for the forwards that ask for attention weights over no pruned cache)."""
    attention = AttentionHandBack.cancel(model) or model.config._attn_implementation
    if attention != NAME:
        model.set_attn_implementation(NAME)
        AttentionHandBack.install(model, attention)


@dataclass
class ModelState:
    """What a press changes on the model, as it was at entry."""

    attention: str
    had_rotary: list[bool]

    @classmethod
    def of(cls, model: PreTrainedModel) -> ModelState:
        """The model's own state, even where an earlier block still holds its attention for a pruned cache."""
        modules = press_hooked_modules(model)
        attention = AttentionHandBack.cancel(model) or model.config._attn_implementation
        return cls(attention, ["rotary_emb" in m._modules for m in modules])

    def restore(self, model: PreTrainedModel, keep_attention: bool) -> None:
        """Undo kvpress's rotary_emb attributes, and the attention implementation: at once, or (`keep_attention`: the
        block left a pruned cache) for the forwards that ask for attention weights over no pruned cache."""
        for module, had in zip(press_hooked_modules(model), self.had_rotary):
            if not had and "rotary_emb" in module._modules:
                del module.rotary_emb
        if model.config._attn_implementation == self.attention:
            return
        if keep_attention:
            AttentionHandBack.install(model, self.attention)
        else:
            model.set_attn_implementation(self.attention)


@dataclass
class AttentionHandBack:
    """A forward pre-hook, from a block that left a pruned cache until the next press block. A pruned cache needs the
    "kvzap" attention (kvpress's question pass, generation over it), which returns no attention weights: a forward
    that asks for them over any other cache gets the model's own implementation back (eager's weights), and a later
    forward over a pruned cache gets "kvzap" again. An implementation the caller selected meanwhile is left alone."""

    attention: str
    handle: object = None  # torch's RemovableHandle

    @classmethod
    def install(cls, model: PreTrainedModel, attention: str) -> None:
        hand_back = cls(attention)
        hand_back.handle = model.register_forward_pre_hook(hand_back, with_kwargs=True)
        model._kvzap_attention_hand_back = hand_back

    @staticmethod
    def cancel(model: PreTrainedModel) -> str | None:
        """Remove a pending hand-back (a new press block takes over); the attention it gives back."""
        hand_back = model.__dict__.pop("_kvzap_attention_hand_back", None)
        if hand_back is None:
            return None
        hand_back.handle.remove()
        return hand_back.attention

    def __call__(self, model, args, kwargs):
        cache, current = kwargs.get("past_key_values"), model.config._attn_implementation
        if any(isinstance(layer, JudgedLayer) for layer in getattr(cache, "layers", ())):
            if current == self.attention:
                model.set_attn_implementation(NAME)
        elif current == NAME and kwargs.get("output_attentions", model.config.output_attentions):
            model.set_attn_implementation(self.attention)
