"""The architectures the plugin overrides, and where each override lives (vLLM imports it lazily, by name). Each
builds `model.layers[i].self_attn` and calls it with `positions=` and `hidden_states=`, where the scorer hooks in."""

SUPPORTED = ("LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen2ForCausalLM", "MistralForCausalLM")
ARCHITECTURES = {name: f"kvzap_vllm.overrides:KVzap{name}" for name in SUPPORTED}
