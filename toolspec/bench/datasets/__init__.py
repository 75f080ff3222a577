"""Benchmark datasets, loaded into one item type: ``load_dataset(spec)`` with ``spec``
``apibank:<level>`` (shipped in ``api_bank/``), ``bfcl:<category>``, ``nestful:<split>``, or a
path (API-Bank JSON, or a user's OpenAI requests as ``.jsonl``)."""

from __future__ import annotations

from toolspec.bench.datasets.apibank import apibank_file, apibank_path, load_apibank, sample_path
from toolspec.bench.datasets.bfcl import load_bfcl
from toolspec.bench.datasets.items import BenchItem, DatasetFormatError
from toolspec.bench.datasets.nestful import load_nestful
from toolspec.bench.datasets.requests import load_requests


def load_dataset(spec: str, limit: int | None = None, skip: int = 0) -> list[BenchItem]:
    """``apibank:level-1`` / ``apibank:level-2`` for the shipped API-Bank sets, ``bfcl:<category>``
    for BFCL v4, ``nestful:<split or file>`` for NESTFUL v1, a ``.jsonl``
    file of OpenAI chat requests (a user's own traffic), otherwise a JSON file in the API-Bank
    processed format. ``skip``: leave out the first items (a data set's tuning part); ``limit``:
    at most that many of the rest."""
    end = None if limit is None else skip + limit
    if spec.startswith("apibank:"):
        items = load_apibank(apibank_path(spec.removeprefix("apibank:")), end)
    elif spec.startswith("bfcl:"):
        items = load_bfcl(spec.removeprefix("bfcl:"), end)
    elif spec.startswith("nestful:"):
        items = load_nestful(spec.removeprefix("nestful:"), end)
    elif spec.endswith(".jsonl"):
        items = load_requests(spec, end)
    else:
        items = load_apibank(spec, end)
    return items[skip:]


__all__ = ["BenchItem", "DatasetFormatError", "apibank_file", "apibank_path", "load_apibank",
           "load_bfcl", "load_dataset", "load_nestful", "load_requests", "sample_path"]
