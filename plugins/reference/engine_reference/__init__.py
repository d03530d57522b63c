"""engine-reference: the torch reference attention backend."""
