"""What HTTP serving costs on top of the engine, and what a session's prefix cache saves.

Against a running deployment (``make serve``), for API-Bank sample dialogues sent the way an
OpenAI client sends them (tools in ``tools``):

- serving overhead per request: client wall time minus the replica's own engine time
  (``toolspec.prefill_s + decode_s``), measured on the same request;
- the same requests run in this process with the engine directly (same model, dtype, drafter
  and budget as the replica), wall time;
- a 2-turn session: the second turn with the session's KV prefix and, as a fresh session,
  without it (prefill time and reused tokens).

Run with ``python load_tests/overhead.py --url http://127.0.0.1:8000`` (it loads the model in
this process too, for the direct runs; run it with the replica idle).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from typing import Any

import httpx

from deployments.messages import ChatRequest
from deployments.replica.engine import EngineSettings
from deployments.replica.toolspec_engine import ToolSpecChatEngine
from toolspec.bench.datasets import load_apibank, sample_path
from toolspec.calls.tools import ToolSet


def post(url: str, payload: dict[str, Any], session: str, tenant: str | None = None
         ) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    headers = {"x-session-id": session}
    if tenant is not None:  # another tenant: nothing of this one's prefix cache is shared
        headers["x-toolspec-tenant"] = tenant
    response = httpx.post(f"{url}/v1/chat/completions", json=payload, headers=headers,
                          timeout=600)
    response.raise_for_status()
    return time.perf_counter() - started, response.json()


def direct(engine: ToolSpecChatEngine, model: str, messages: list[dict[str, Any]],
           tools: list[dict[str, Any]], max_tokens: int) -> float:
    toolset = ToolSet.from_openai(tools)
    request = ChatRequest(uuid.uuid4().hex, model, tuple(messages), tools=toolset,
                          openai_tools=tuple(t.openai() for t in toolset), max_tokens=max_tokens)
    started = time.perf_counter()
    job = engine.open(request, None).job
    while not job.done:
        engine.step([job])
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--draft-budget", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()
    items = load_apibank(sample_path())
    engine = ToolSpecChatEngine(EngineSettings(model=args.model, dtype=args.dtype,
                                               draft_budget=args.draft_budget,
                                               prefix_cache_bytes=0))
    rows = []
    for item in items:
        messages = [dict(m) for m in item.messages if m["role"] != "system"]
        tools = [tool.openai() for tool in item.tools]
        payload = {"model": args.model, "messages": messages, "tools": tools,
                   "max_tokens": args.max_tokens}
        wall, body = post(args.url, payload, uuid.uuid4().hex)
        extension = body["toolspec"]
        engine_s = extension["prefill_s"] + extension["decode_s"]
        direct_s = direct(engine, args.model, messages, tools, args.max_tokens)
        # Turn 2 of the same session: the call, its result, a follow-up question.
        message = body["choices"][0]["message"]
        follow_up = messages + [
            {"role": "assistant", "content": message["content"] or "",
             "tool_calls": message.get("tool_calls") or None},
            {"role": "tool", "content": json.dumps({"status": "ok"}),
             "tool_call_id": (message.get("tool_calls") or [{"id": "x"}])[0]["id"]},
            {"role": "user", "content": "Thanks. Please do the same again."}]
        follow_up = [{k: v for k, v in m.items() if v is not None} for m in follow_up]
        session = uuid.uuid4().hex
        post(args.url, payload, session)  # turn 1 of this session
        _, reused = post(args.url, {**payload, "messages": follow_up}, session)
        _, fresh = post(args.url, {**payload, "messages": follow_up}, uuid.uuid4().hex,
                        tenant=f"fresh-{uuid.uuid4().hex[:8]}")
        rows.append({"item": item.id, "wall_s": wall, "engine_s": engine_s,
                     "overhead_s": wall - engine_s, "direct_s": direct_s,
                     "tokens": body["usage"]["completion_tokens"], "mat": extension["mat"],
                     "turn2_prefill_reused_s": reused["toolspec"]["prefill_s"],
                     "turn2_prefill_fresh_s": fresh["toolspec"]["prefill_s"],
                     "turn2_prompt_tokens": reused["usage"]["prompt_tokens"],
                     "turn2_cached_tokens": reused["usage"]["prompt_tokens_details"][
                         "cached_tokens"]})
        print(json.dumps(rows[-1]))
    overhead = [r["overhead_s"] for r in rows]
    print(json.dumps({
        "requests": len(rows),
        "overhead_ms_median": 1000 * statistics.median(overhead),
        "overhead_pct_of_wall_median": 100 * statistics.median(
            r["overhead_s"] / r["wall_s"] for r in rows),
        "http_wall_s_total": sum(r["wall_s"] for r in rows),
        "direct_s_total": sum(r["direct_s"] for r in rows),
        "turn2_prefill_reused_s_total": sum(r["turn2_prefill_reused_s"] for r in rows),
        "turn2_prefill_fresh_s_total": sum(r["turn2_prefill_fresh_s"] for r in rows),
        "turn2_reused_share": sum(r["turn2_reused_tokens"] for r in rows)
        / sum(r["turn2_prompt_tokens"] for r in rows),
    }, indent=2))


if __name__ == "__main__":
    main()
