"""engine-moe: mixture-of-experts architectures (Qwen3MoeForCausalLM, MixtralForCausalLM)."""
