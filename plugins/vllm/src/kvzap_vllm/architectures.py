"""The architectures the plugin overrides, and where each override lives (vLLM imports it lazily, by name)."""

ARCHITECTURES = {"LlamaForCausalLM": "kvzap_vllm.overrides:KVzapLlamaForCausalLM"}
