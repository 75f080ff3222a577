"""What a request brings to the ToolSpec proposer inside vLLM's worker.

vLLM hands a custom proposer token ids only. What drafting needs besides them — the tools the
request offers, the format its calls are written in, whose past calls may be drafted, the
conversation argument values are copied from, and those past calls themselves — rides with the
request in ``SamplingParams.extra_args[EXTRA_ARGS_KEY]`` as plain JSON types (vLLM serializes
them to its engine process; the proposer reads them from the worker's request state). The replica
builds it at admission (``to_extra_args``); the proposer reads it once per request
(``from_extra_args``). Nothing here mutates.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from toolspec.calls.formats import FORMATS
from toolspec.library import CallLibrary
from toolspec.library.transfer import export_record

EXTRA_ARGS_KEY = "toolspec"


class DraftingRequestError(ValueError):
    """``extra_args[EXTRA_ARGS_KEY]`` is not what ``DraftingRequest.to_extra_args`` writes."""


@dataclass(frozen=True)
class DraftingRequest:
    """One request's drafting context.

    ``method``: a registry method (``toolspec``, ``toolspec-schema``, ``suffix``, ...; the
    proposer's default when absent); ``tools``: the offered tools as OpenAI dicts (``{"type":
    "function", "function": {...}}``), empty when the request offers none; ``call_format``: a
    name in ``toolspec.calls.formats.FORMATS``; ``past_calls``: the tenant's calls of those
    tools as ``toolspec.library.transfer.export_record`` dicts, best first.
    """

    tenant: str = "default"
    method: str | None = None
    call_format: str | None = None
    tools: tuple[Mapping[str, Any], ...] = ()
    conversation: str = ""
    past_calls: tuple[Mapping[str, Any], ...] = ()

    def to_extra_args(self) -> dict[str, Any]:
        """``SamplingParams.extra_args`` carrying this request (plain JSON types)."""
        body: dict[str, Any] = {"tenant": self.tenant, "tools": [dict(t) for t in self.tools],
                                "conversation": self.conversation,
                                "past_calls": [dict(c) for c in self.past_calls]}
        if self.method is not None:
            body["method"] = self.method
        if self.call_format is not None:
            body["call_format"] = self.call_format
        return {EXTRA_ARGS_KEY: body}

    @classmethod
    def from_extra_args(cls, extra_args: Mapping[str, Any] | None) -> DraftingRequest | None:
        """The request ``extra_args`` carries, or None when it carries none (a request sent
        to vLLM by anyone else: the proposer then drafts with its fallback alone). Raises
        ``DraftingRequestError`` when the entry is malformed."""
        body = (extra_args or {}).get(EXTRA_ARGS_KEY)
        if body is None:
            return None
        if not isinstance(body, Mapping):
            raise DraftingRequestError(f"extra_args[{EXTRA_ARGS_KEY!r}] must be an object")
        call_format = body.get("call_format")
        if call_format is not None and call_format not in FORMATS:
            raise DraftingRequestError(f"unknown call format {call_format!r}; known: "
                                       f"{', '.join(FORMATS)}")
        return cls(
            tenant=_typed(body, "tenant", str, "default"),
            method=_typed(body, "method", str, None),
            call_format=call_format,
            tools=_objects(body, "tools"),
            conversation=_typed(body, "conversation", str, ""),
            past_calls=_objects(body, "past_calls"),
        )


def _typed(body: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key, default)
    if value is not default and not isinstance(value, kind):
        raise DraftingRequestError(f"{key!r} must be a {kind.__name__}, got {value!r:.80}")
    return value


def _objects(body: Mapping[str, Any], key: str) -> tuple[Mapping[str, Any], ...]:
    value = body.get(key, ())
    if not isinstance(value, Sequence) or isinstance(value, str) \
            or not all(isinstance(item, Mapping) for item in value):
        raise DraftingRequestError(f"{key!r} must be a list of objects")
    return tuple(value)


def past_calls(library: CallLibrary, tenant: str, tools: Sequence[str], per_tool: int = 16
               ) -> tuple[dict[str, Any], ...]:
    """``tenant``'s most used calls of each of ``tools`` in ``library`` (at most ``per_tool``
    each), as a request carries them (``export_record`` dicts). Reads only."""
    return tuple(export_record(record) for tool in dict.fromkeys(tools)
                 for record in library.top_calls(tenant, per_tool, tool))
