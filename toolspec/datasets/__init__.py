"""Benchmark datasets, loaded into one item type: ``load_dataset("path.json" | "bfcl:<cat>")``."""

from __future__ import annotations

from toolspec.datasets.apibank import load_apibank, sample_path
from toolspec.datasets.bfcl import load_bfcl
from toolspec.datasets.items import BenchItem, DatasetFormatError


def load_dataset(spec: str, limit: int | None = None) -> list[BenchItem]:
    """``bfcl:<category>`` for BFCL v4, otherwise a JSON file in the API-Bank processed format."""
    if spec.startswith("bfcl:"):
        return load_bfcl(spec.removeprefix("bfcl:"), limit)
    return load_apibank(spec, limit)


__all__ = ["BenchItem", "DatasetFormatError", "load_apibank", "load_bfcl", "load_dataset",
           "sample_path"]
