"""``python load_tests/sessions.py DATA OUT [--bfcl CATEGORY:N ...]``: API-Bank dialogues (and
BFCL items) as chat sessions in OpenAI form, for the Locust load test (which must not import
toolspec or ray: it runs under gevent) and ``load_tests/concurrency.py``.

Each dialogue's ``<user>``/``<response>`` records become turns: turn k sends the first k user
messages with the recorded responses between them; the tools (from the API-Bank system prompt)
go in ``tools``. A BFCL item is a one-turn session; its function names are made OpenAI-valid
(``math.factorial`` → ``math_factorial``, as BFCL's own OpenAI handler does).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from toolspec.bench.datasets import load_bfcl
from toolspec.calls.tools import ToolSet

_RECORD = re.compile(r"<(user|response)>(.*?)</\1>", re.DOTALL)


def dialogue_sessions(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    sessions = []
    for index, record in enumerate(records):
        tools = [tool.openai() for tool in ToolSet.from_apibank_prompt(record["system"])]
        history: list[dict[str, str]] = []
        turns = []
        for role, text in _RECORD.findall(record["user"]):
            message = {"role": "user" if role == "user" else "assistant", "content": text.strip()}
            history.append(message)
            if role == "user":
                turns.append(list(history))
        if tools and turns:
            sessions.append({"id": f"apibank-{index}", "tools": tools, "turns": turns})
    return sessions


def bfcl_sessions(category: str, limit: int) -> list[dict[str, Any]]:
    """The first ``limit`` items of a BFCL category as one-turn sessions."""
    sessions = []
    for item in load_bfcl(category, limit):
        tools = []
        for tool in item.openai_tools or ():
            function = dict(tool["function"])
            function["name"] = _OPENAI_INVALID.sub("_", function["name"])[:64]
            tools.append({"type": "function", "function": function})
        sessions.append({"id": f"bfcl-{item.id}", "tools": tools,
                         "turns": [[dict(m) for m in item.messages]]})
    return sessions


_OPENAI_INVALID = re.compile(r"[^a-zA-Z0-9_-]")


def main(argv: list[str]) -> int:
    paths = [arg for arg in argv if not arg.startswith("--") and ":" not in arg]
    if len(paths) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    sessions = dialogue_sessions(json.loads(Path(paths[0]).read_text()))
    for spec in (arg for index, arg in enumerate(argv) if index and argv[index - 1] == "--bfcl"):
        category, _, count = spec.partition(":")
        sessions += bfcl_sessions(category, int(count or 20))
    argv = paths
    Path(argv[1]).write_text(json.dumps(sessions))
    print(f"{len(sessions)} sessions, {sum(len(s['turns']) for s in sessions)} turns -> {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
