"""engine-gemma: the Gemma2ForCausalLM and Gemma3ForCausalLM (text) architectures."""
