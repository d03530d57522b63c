"""engine-triton: Triton paged-attention backend."""
