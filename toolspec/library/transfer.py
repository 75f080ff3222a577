"""Reading calls to import and writing exports: plain functions over files, no LMDB here.

Import reads two shapes:

- API-Bank as processed by the ToolSpec authors: a JSON list of ``{"system", "user", "answer"}``
  where ``answer`` is a call or a list of calls, a call being ``{"name", "parameters"}``;
- JSON lines (or a JSON list) of ``{"name", "arguments" | "parameters", "tenant"?}``, arguments
  possibly given as a JSON string (OpenAI messages do that).

Export writes JSON lines of ``{"tenant", "name", "arguments", "hits", "first_seen", "last_used"}``,
which import reads back with their usage: a call keeps its hits and times across an export and
an import (lines without them count as one use, now).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from toolspec.calls.formats import ToolCall, parse_arguments_json
from toolspec.library.errors import InvalidCallError, LibraryImportError
from toolspec.library.keys import check_when
from toolspec.library.records import CallRecord, Usage

ImportedCall = tuple[ToolCall, str, Usage | None]  # a call, its tenant, its earlier use


def _call(obj: Any, where: str) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise LibraryImportError(f"{where}: a call needs a string 'name', got {obj!r:.120}")
    arguments = obj.get("arguments", obj.get("parameters", {}))
    try:
        arguments = parse_arguments_json(arguments)
    except json.JSONDecodeError as error:
        raise LibraryImportError(f"{where}: arguments string is not JSON ({error})") from None
    if not isinstance(arguments, dict):
        raise LibraryImportError(f"{where}: arguments must be a JSON object, got {arguments!r:.80}")
    return ToolCall(obj["name"], arguments)


def _tenant(obj: dict[str, Any], default: str, where: str) -> str:
    tenant = obj.get("tenant", default)
    if not isinstance(tenant, str):
        raise LibraryImportError(f"{where}: 'tenant' must be a string, got {tenant!r}")
    return tenant


def _from_list(records: list[Any], path: Path, tenant: str) -> Iterator[ImportedCall]:
    for index, record in enumerate(records):
        where = f"{path}[{index}]"
        if isinstance(record, dict) and "answer" in record:  # API-Bank item
            answer = record["answer"]
            for call in answer if isinstance(answer, list) else [answer]:
                yield _call(call, where), tenant, None
        elif isinstance(record, dict):
            yield import_record(record, where, tenant)
        else:
            raise LibraryImportError(f"{where}: expected an API-Bank item or a call object")


def _usage(obj: dict[str, Any], where: str) -> Usage | None:
    """The ``hits``, ``first_seen`` and ``last_used`` an exported line carries (None: none)."""
    if not any(key in obj for key in ("hits", "first_seen", "last_used")):
        return None
    hits = obj.get("hits", 1)
    if not isinstance(hits, int) or isinstance(hits, bool) or hits < 1:
        raise LibraryImportError(f"{where}: 'hits' must be an integer >= 1, got {hits!r}")
    times = []
    for key in ("first_seen", "last_used"):
        value = obj.get(key)
        if value is not None:
            if not isinstance(value, (int, float)) or isinstance(value, bool):
                raise LibraryImportError(f"{where}: '{key}' must be seconds since the epoch")
            try:
                value = check_when(value)
            except InvalidCallError as error:
                raise LibraryImportError(f"{where}: {error}") from None
        times.append(value)
    return Usage(hits, *times)


def _from_lines(text: str, path: Path, tenant: str) -> Iterator[ImportedCall]:
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as error:
            raise LibraryImportError(f"{where}: not valid JSON ({error.msg}); expected one call "
                                     f"object per line or an API-Bank JSON list") from None
        yield import_record(obj, where, tenant)


def read_calls(path: str | Path, tenant: str) -> list[ImportedCall]:
    """Every (call, tenant, usage) in ``path`` (usage None where the file gives none); raises
    LibraryImportError naming the bad line/item."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LibraryImportError(f"{path}: no such file") from None
    except (IsADirectoryError, UnicodeDecodeError, PermissionError) as error:
        raise LibraryImportError(f"{path}: cannot read it as UTF-8 text ({error})") from None
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        whole = None
    if isinstance(whole, list):
        return list(_from_list(whole, path, tenant))
    return list(_from_lines(text, path, tenant))


def export_record(record: CallRecord) -> dict[str, Any]:
    """``record`` as plain JSON types (an export's line; what a request carries to vLLM's
    worker): ``import_record`` reads it back with its usage."""
    return {"tenant": record.tenant, "name": record.tool, "arguments": dict(record.arguments),
            "hits": record.hits, "first_seen": record.first_seen, "last_used": record.last_used}


def import_record(obj: Any, where: str = "record", tenant: str = "default") -> ImportedCall:
    """An exported record (``export_record``) as (call, tenant, usage); raises
    LibraryImportError naming ``where`` when it is malformed."""
    if not isinstance(obj, dict):
        raise LibraryImportError(f"{where}: expected a call object, got {obj!r:.80}")
    return _call(obj, where), _tenant(obj, tenant, where), _usage(obj, where)


def export_line(record: CallRecord) -> str:
    return json.dumps(export_record(record), ensure_ascii=False)


def write_lines(path: str | Path, records: Iterable[CallRecord]) -> int:
    """Writes ``records`` as JSON lines to ``path`` (replaced atomically); returns the count."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")
    count = 0
    with partial.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(export_line(record) + "\n")
            count += 1
    partial.replace(path)
    return count
