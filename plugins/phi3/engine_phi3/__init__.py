"""engine-phi3: the Phi3ForCausalLM model architecture (Phi-3, Phi-3.5, Phi-4)."""
