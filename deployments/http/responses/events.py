"""The Responses stream's events for one answer (``ResponseEvents``).

Mutates: each ``ResponseEvents`` itself (its sequence number and what it has announced).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from deployments.http.responses.protocol import (
    message_item,
    output_text_part,
    response_object,
)
from deployments.http.schemas import ResponsesRequest
from deployments.http.tool_stream import OutputDelta


class ResponseEvents:
    """The Responses stream's events for one answer, from the same ``OutputDelta``s a chat
    stream is made of: ``response.created``/``in_progress``, then the message item (its text
    part's deltas) and one ``function_call`` item per call (its arguments' deltas), each
    opened and closed in order, then ``response.completed`` — or, for an answer cut at
    ``max_output_tokens``, ``response.incomplete``, the item open at the cut closed as
    ``incomplete``. Every event carries the next ``sequence_number``. Mutates: itself."""

    def __init__(self, body: ResponsesRequest, response_id: str, created_at: int) -> None:
        self.body = body
        self.response_id = response_id
        self.created_at = created_at
        self._sequence = 0
        self._text: str | None = None  # the open message's text (None: no message open)
        self._calls: dict[int, dict[str, Any]] = {}  # by call index: its item as it grows
        self._open_call: int | None = None
        self._closed: list[dict[str, Any]] = []  # finished items, in output order

    def start(self) -> str:
        shell = self._response("in_progress", [], None)
        return self._event("response.created", response=shell) + \
            self._event("response.in_progress", response=shell)

    def feed(self, delta: OutputDelta) -> str:
        events = ""
        if delta.content:
            if self._text is None:
                self._text = ""
                events += self._event("response.output_item.added", output_index=self._index(),
                                      item=message_item(self.response_id, None, "in_progress"))
                events += self._event("response.content_part.added", **self._where(),
                                      part=output_text_part(""))
            self._text += delta.content
            events += self._event("response.output_text.delta", **self._where(),
                                  delta=delta.content, logprobs=[])
        for fragment in delta.tool_calls:
            if fragment.name is not None:  # a new call: whatever was open is complete
                events += self._close_message() + self._close_call()
                item = {"type": "function_call", "id": f"fc_{self.response_id[5:]}_"
                        f"{fragment.index}", "call_id": fragment.id, "name": fragment.name,
                        "arguments": "", "status": "in_progress"}
                self._calls[fragment.index], self._open_call = item, fragment.index
                events += self._event("response.output_item.added",
                                      output_index=self._index(), item=dict(item))
            item = self._calls[fragment.index]
            item["arguments"] += fragment.arguments
            if fragment.arguments:
                events += self._event("response.function_call_arguments.delta",
                                      item_id=item["id"], output_index=self._index(),
                                      delta=fragment.arguments)
        return events

    def finish(self, usage: Mapping[str, Any], incomplete: str | None,
               toolspec: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
        """The closing events and the finished response object. ``incomplete``: why the
        answer was cut (the items still open were cut with it)."""
        status = "incomplete" if incomplete else "completed"
        events = self._close_message(status) + self._close_call(status)
        response = self._response(status, self._closed, usage, incomplete, toolspec)
        kind = "response.incomplete" if incomplete else "response.completed"
        return events + self._event(kind, response=response), response

    def fail(self, error: Mapping[str, Any]) -> str:
        """An ``error`` event, then ``response.failed``: the stream ends with them."""
        detail = error.get("error", error)
        failure = {"code": detail.get("code") or "server_error",
                   "message": detail.get("message", "")}
        return self._event("error", **failure, param=detail.get("param")) + self._event(
            "response.failed", response=self._response("failed", self._closed, None,
                                                       error=failure))

    def _close_message(self, status: str = "completed") -> str:
        if self._text is None:
            return ""
        text, self._text = self._text, None
        where = self._where()
        item = message_item(self.response_id, text, status)
        self._closed.append(item)
        return (self._event("response.output_text.done", **where, text=text, logprobs=[])
                + self._event("response.content_part.done", **where,
                              part=output_text_part(text))
                + self._event("response.output_item.done", output_index=where["output_index"],
                              item=item))

    def _close_call(self, status: str = "completed") -> str:
        if self._open_call is None:
            return ""
        item = {**self._calls[self._open_call], "status": status}
        self._open_call = None
        index = self._index()
        self._closed.append(item)
        return (self._event("response.function_call_arguments.done", item_id=item["id"],
                            output_index=index, arguments=item["arguments"], name=item["name"])
                + self._event("response.output_item.done", output_index=index, item=item))

    def _index(self) -> int:
        """The output index of the item open now (or about to open)."""
        return len(self._closed)

    def _where(self) -> dict[str, Any]:
        return {"item_id": f"msg_{self.response_id[5:]}", "output_index": self._index(),
                "content_index": 0}

    def _response(self, status: str, output: list[dict[str, Any]],
                  usage: Mapping[str, Any] | None, incomplete: str | None = None,
                  toolspec: Mapping[str, Any] | None = None,
                  error: Mapping[str, Any] | None = None) -> dict[str, Any]:
        return response_object(self.body, self.response_id, self.created_at, list(output),
                               status, usage, incomplete, toolspec, error)

    def _event(self, kind: str, **fields: Any) -> str:
        body = {"type": kind, "sequence_number": self._sequence, **fields}
        self._sequence += 1
        return f"event: {kind}\ndata: {json.dumps(body, ensure_ascii=False)}\n\n"
