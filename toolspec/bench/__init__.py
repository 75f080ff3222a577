"""Benchmarks: methods measured side by side against plain decoding in one run."""
