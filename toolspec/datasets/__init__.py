"""Benchmark datasets, loaded into one item type."""

from toolspec.datasets.apibank import BenchItem, DatasetFormatError, load_apibank, sample_path

__all__ = ["BenchItem", "DatasetFormatError", "load_apibank", "sample_path"]
