"""FP8 (float8_e4m3fn) linear layers: online quantization and pre-quantized checkpoints."""
