"""engine-qwen2: the Qwen2ForCausalLM model architecture (Qwen2, Qwen2.5)."""
