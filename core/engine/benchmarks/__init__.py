"""Benchmarks behind ``engine bench``: offline throughput, latency, and serving load."""
