"""``python load_tests/sessions.py DATA OUT``: API-Bank dialogues as multi-turn chat sessions
for the Locust load test (which must not import toolspec or ray: it runs under gevent).

Each dialogue's ``<user>``/``<response>`` records become turns: turn k sends the first k user
messages with the recorded responses between them; the tools (from the API-Bank system prompt)
go in ``tools``.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

from toolspec.tools import ToolSet

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


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    sessions = dialogue_sessions(json.loads(Path(argv[0]).read_text()))
    Path(argv[1]).write_text(json.dumps(sessions))
    print(f"{len(sessions)} sessions, {sum(len(s['turns']) for s in sessions)} turns -> {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
