"""Benchmark datasets, loaded into one item type: ``load_dataset(spec)`` with ``spec`` a path
(API-Bank JSON, or a user's OpenAI requests as ``.jsonl``), ``bfcl:<category>`` or
``nestful:<split>``."""

from __future__ import annotations

from toolspec.datasets.apibank import load_apibank, sample_path
from toolspec.datasets.bfcl import load_bfcl
from toolspec.datasets.items import BenchItem, DatasetFormatError
from toolspec.datasets.nestful import load_nestful
from toolspec.datasets.requests import load_requests


def load_dataset(spec: str, limit: int | None = None, skip: int = 0) -> list[BenchItem]:
    """``bfcl:<category>`` for BFCL v4, ``nestful:<split or file>`` for NESTFUL v1, a ``.jsonl``
    file of OpenAI chat requests (a user's own traffic), otherwise a JSON file in the API-Bank
    processed format. ``skip``: leave out the first items (a data set's tuning part); ``limit``:
    at most that many of the rest."""
    end = None if limit is None else skip + limit
    if spec.startswith("bfcl:"):
        items = load_bfcl(spec.removeprefix("bfcl:"), end)
    elif spec.startswith("nestful:"):
        items = load_nestful(spec.removeprefix("nestful:"), end)
    elif spec.endswith(".jsonl"):
        items = load_requests(spec, end)
    else:
        items = load_apibank(spec, end)
    return items[skip:]


__all__ = ["BenchItem", "DatasetFormatError", "load_apibank", "load_bfcl", "load_dataset",
           "load_nestful", "load_requests", "sample_path"]
