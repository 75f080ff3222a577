"""Benchmark datasets, loaded into one item type: ``load_dataset(spec)`` with ``spec`` a path,
``bfcl:<category>`` or ``nestful:<split>``."""

from __future__ import annotations

from toolspec.datasets.apibank import load_apibank, sample_path
from toolspec.datasets.bfcl import load_bfcl
from toolspec.datasets.items import BenchItem, DatasetFormatError
from toolspec.datasets.nestful import load_nestful


def load_dataset(spec: str, limit: int | None = None) -> list[BenchItem]:
    """``bfcl:<category>`` for BFCL v4, ``nestful:<split or file>`` for NESTFUL v1, otherwise a
    JSON file in the API-Bank processed format."""
    if spec.startswith("bfcl:"):
        return load_bfcl(spec.removeprefix("bfcl:"), limit)
    if spec.startswith("nestful:"):
        return load_nestful(spec.removeprefix("nestful:"), limit)
    return load_apibank(spec, limit)


__all__ = ["BenchItem", "DatasetFormatError", "load_apibank", "load_bfcl", "load_dataset",
           "load_nestful", "sample_path"]
