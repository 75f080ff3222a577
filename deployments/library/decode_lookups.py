"""Retrieval during decoding: follow-up library lookups driven by what the output reveals.

At request start the replica fetches the most used calls of every offered tool. Once the output
names the tool of a call, and as it types the call's arguments, it knows more: the calls worth
having are the stored calls of *that* tool that extend *what is typed* — values included, which
the most-used list may miss. ``DecodeLookups`` watches the output step by step and asks the
retrieval actor for exactly those (``LibraryCache.lookup``).

A lookup never blocks a decoding step: it runs in the background while the model keeps
decoding; the calls it brings land in the replica's local library view, which the drafter reads
at every step — so the first step after they arrive drafts from them, and the steps before just
do not. One lookup per request is in flight at a time; when it returns, the next one asks with
the text typed by then. When a lookup returned every matching call (fewer than its limit), no
longer text can match anything new, and lookups for that call stop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from deployments.library.cache import LibraryCache
from deployments.messages import ChatRequest
from toolspec.calls.output import CallSpan


class DecodeLookups:
    """Follow-up lookups for one request.

    It parses nothing: each step's event says where the output's calls lie (the request's one
    parse, made on the worker thread). Mutates: the output text it has seen, its in-flight task
    and ``issued``; starts background fetches on ``cache`` that fill the local library view.
    """

    def __init__(self, cache: LibraryCache, request: ChatRequest, arguments_key: str,
                 max_lookups: int = 32) -> None:
        self.cache = cache
        self.tenant = request.tenant
        self.tools = frozenset(request.tools.names) if request.tools is not None else frozenset()
        self.arguments_key = arguments_key
        self.max_lookups = max_lookups
        self.text = ""  # the visible output so far
        self.issued = 0
        self._pending: asyncio.Task | None = None
        self._pending_typed = ""
        self._asked: set[str] = set()  # call texts already asked for
        self._exhausted: list[str] = []  # call texts whose every match has been fetched

    def observe(self, text: str, calls: Sequence[CallSpan]) -> None:
        """Take the text a decoding step added and where the output's calls lie; start a
        lookup if it revealed something new and none is in flight. Returns at once."""
        self.text += text
        if self._pending is not None:
            if not self._pending.done():
                return
            task = self._pending
            if not task.cancelled() and task.exception() is None and task.result():
                self._exhausted.append(self._pending_typed)
            self._pending = None
        live = calls[-1] if calls and not calls[-1].done else None
        if live is None or live.name not in self.tools or live.start >= len(self.text):
            return  # no call open, its tool not known yet, or not visible yet
        tool, typed = live.name, self.text[live.start:]
        if typed in self._asked or self.issued >= self.max_lookups:
            return
        if any(typed.startswith(done) for done in self._exhausted):
            return
        task = self.cache.lookup(self.tenant, tool, typed, self.arguments_key)
        if task is not None:
            self._pending, self._pending_typed = task, typed
            self._asked.add(typed)
            self.issued += 1
