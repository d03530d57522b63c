"""AWQ 4-bit linear layers read from AutoAWQ GEMM checkpoints."""
