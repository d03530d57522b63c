"""engine-qwen3: the Qwen3ForCausalLM model architecture."""
