"""engine-llama: the LlamaForCausalLM and MistralForCausalLM architectures."""
