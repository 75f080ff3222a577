"""Locust load test: multi-turn API-Bank sessions against the OpenAI-compatible endpoint.

Each simulated user replays one dialogue turn by turn with one ``x-session-id`` (so the router
keeps it on one replica and the replica reuses its KV prefix). Sessions come from
``load_tests/sessions.json`` (``python load_tests/sessions.py DATA load_tests/sessions.json``;
the five bundled API-Bank samples are the default). Never import ray (or toolspec) here: Locust
runs on gevent, and Ray hangs under it.

Headless, 4 users for 2 minutes, CSV summary under results/locust::

    locust -f load_tests/locustfile.py --host http://127.0.0.1:8000 --headless -u 4 -r 1 \\
        -t 2m --csv results/locust/run --only-summary

``TOOLSPEC_MODEL`` names the served model, ``TOOLSPEC_SESSIONS`` another sessions file,
``TOOLSPEC_MAX_TOKENS`` the answer length (default 96).
"""

from __future__ import annotations

import json
import os
import random
import uuid
from pathlib import Path

from locust import HttpUser, between, task

SESSIONS = json.loads(Path(os.environ.get(
    "TOOLSPEC_SESSIONS", Path(__file__).with_name("sessions.json"))).read_text())
MODEL = os.environ.get("TOOLSPEC_MODEL", "qwen2.5-coder-0.5b")
MAX_TOKENS = int(os.environ.get("TOOLSPEC_MAX_TOKENS", "96"))


class ToolCallingSession(HttpUser):
    """Replays whole dialogues: every turn of one session, then the next session."""

    wait_time = between(0.5, 2.0)

    @task
    def dialogue(self) -> None:
        session = random.choice(SESSIONS)
        session_id = f"{session['id']}-{uuid.uuid4().hex[:8]}"
        for number, messages in enumerate(session["turns"], start=1):
            payload = {"model": MODEL, "messages": messages, "tools": session["tools"],
                       "max_tokens": MAX_TOKENS}
            with self.client.post("/v1/chat/completions", json=payload,
                                  headers={"x-session-id": session_id},
                                  name=f"turn {min(number, 3)}{'+' if number >= 3 else ''}",
                                  catch_response=True) as response:
                if response.status_code != 200:
                    response.failure(f"HTTP {response.status_code}: {response.text[:200]}")
                    return
                body = response.json()
                if "choices" not in body:
                    response.failure(f"not a chat.completion: {response.text[:200]}")
                    return
