"""Agent loops run by the frameworks users bring, against a running deployment (loopback only).

Runs in its own venv (``make agents-venv``: the OpenAI Agents SDK, LangGraph, LangChain's
``ChatOpenAI``), never importing ray or toolspec, as a user's agent process would. One loop:
the framework calls the model, runs the local Python tool the model called, sends the result
back, and calls the model again — until the model answers or the framework's own turn limit
ends it. What each turn looked like *inside the framework* is printed as one JSON document, for
a test to check the server's part: every turn parsed, call ids round-trip, arguments are the
tool's schema, and the usage of later turns shows the cached prompt.

    .venv-agents/bin/python load_tests/agent_loops.py --base-url http://127.0.0.1:8000 \\
        --framework openai-agents --api responses --stream
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any
from urllib.parse import urlparse

QUESTION = "What is the weather in Paris? Use the get_weather tool."
INSTRUCTIONS = ("You answer questions about the weather. Call get_weather once for the city. "
                "When you have its result, answer the user in one sentence and call no tool.")


class WeatherTool:
    """The local tool: records each call the framework made with the arguments it parsed."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, city: str) -> str:
        self.calls.append({"city": city})
        return json.dumps({"city": city, "celsius": 21, "sky": "sunny"})


async def openai_agents(args: argparse.Namespace, tool: WeatherTool) -> dict[str, Any]:
    from agents import (
        Agent,
        MaxTurnsExceeded,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        ToolCallItem,
        ToolCallOutputItem,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)  # nothing leaves this machine
    client = AsyncOpenAI(base_url=f"{args.base_url}/v1", api_key="unused", max_retries=0,
                         timeout=args.timeout_s)
    model_class = OpenAIResponsesModel if args.api == "responses" else OpenAIChatCompletionsModel
    model = model_class(model=args.model, openai_client=client)

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city.

        Args:
            city: The city's name.
        """
        return tool(city)

    settings = ModelSettings(temperature=0, max_tokens=args.max_tokens,
                             parallel_tool_calls=False,  # one call a turn, then its result
                             extra_headers={"x-session-id": args.session},
                             include_usage=True if args.api == "chat" else None)
    agent = Agent(name="weather", instructions=args.instructions, tools=[get_weather], model=model,
                  model_settings=settings)
    exceeded = False
    try:
        if args.stream:
            result = Runner.run_streamed(agent, args.question, max_turns=args.max_turns)
            async for _ in result.stream_events():
                pass
        else:
            result = await Runner.run(agent, args.question, max_turns=args.max_turns)
        items, responses, final = result.new_items, result.raw_responses, result.final_output
    except MaxTurnsExceeded as error:  # the framework's own bound: the model kept calling
        exceeded = True
        data = error.run_data
        items, responses, final = data.new_items, data.raw_responses, None
    calls = [_raw(item.raw_item) for item in items if isinstance(item, ToolCallItem)]
    outputs = [_raw(item.raw_item) for item in items if isinstance(item, ToolCallOutputItem)]
    return {
        "final_output": final if isinstance(final, str) else None,
        "max_turns_exceeded": exceeded,
        "tool_calls": [{"call_id": c.get("call_id") or c.get("id"), "name": c.get("name"),
                        "arguments": c.get("arguments")} for c in calls],
        "tool_outputs": [{"call_id": o.get("call_id")} for o in outputs],
        "usage": [{"input_tokens": r.usage.input_tokens, "output_tokens": r.usage.output_tokens,
                   "cached_tokens": r.usage.input_tokens_details.cached_tokens or 0}
                  for r in responses],
    }


def langgraph(args: argparse.Namespace, tool: WeatherTool) -> dict[str, Any]:
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.tools import tool as as_tool
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.errors import GraphRecursionError
    from langgraph.prebuilt import create_react_agent

    @as_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return tool(city)

    model = ChatOpenAI(base_url=f"{args.base_url}/v1", api_key="unused", model=args.model,
                       temperature=0, max_tokens=args.max_tokens, max_retries=0,
                       timeout=args.timeout_s, streaming=args.stream,
                       stream_usage=True, default_headers={"x-session-id": args.session})
    bound = model.bind_tools([get_weather], parallel_tool_calls=False)
    # The checkpointer keeps the conversation where the turn limit stops the graph.
    agent = create_react_agent(bound, [get_weather], prompt=args.instructions,
                               checkpointer=InMemorySaver())
    # LangGraph's own bound: a model turn and a tool turn per step of the loop.
    config = {"recursion_limit": 2 * args.max_turns + 1,
              "configurable": {"thread_id": args.session}}
    inputs = {"messages": [("user", args.question)]}
    exceeded = False
    try:
        if args.stream:
            for _ in agent.stream(inputs, config, stream_mode="values"):
                pass
        else:
            agent.invoke(inputs, config)
    except GraphRecursionError:
        exceeded = True
    messages = agent.get_state(config).values["messages"]
    answers = [m for m in messages if isinstance(m, AIMessage)]
    last = answers[-1] if answers else None
    return {
        "final_output": last.content if last is not None and not last.tool_calls else None,
        "max_turns_exceeded": exceeded,
        "tool_calls": [{"call_id": c["id"], "name": c["name"], "arguments": json.dumps(c["args"])}
                       for m in answers for c in m.tool_calls],
        "invalid_tool_calls": [c for m in answers for c in m.invalid_tool_calls],
        "tool_outputs": [{"call_id": m.tool_call_id} for m in messages
                         if isinstance(m, ToolMessage)],
        "usage": [{"input_tokens": m.usage_metadata["input_tokens"],
                   "output_tokens": m.usage_metadata["output_tokens"],
                   "cached_tokens": (m.usage_metadata.get("input_token_details") or {}
                                     ).get("cache_read", 0)}
                  for m in answers if m.usage_metadata],
    }


def _raw(item: Any) -> dict[str, Any]:
    return item if isinstance(item, dict) else item.model_dump()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True, help="the deployment, e.g. "
                                                           "http://127.0.0.1:8000")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--framework", choices=["openai-agents", "langgraph"], required=True)
    parser.add_argument("--api", choices=["responses", "chat"], default="responses",
                        help="openai-agents: the Responses or the chat-completions model class")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--session", default="agent-loop", help="x-session-id of every turn")
    parser.add_argument("--question", default=QUESTION)
    parser.add_argument("--instructions", default=INSTRUCTIONS, help="the agent's system prompt")
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--timeout-s", type=float, default=300.0)
    args = parser.parse_args()
    host = urlparse(args.base_url).hostname
    if host not in ("127.0.0.1", "localhost", "::1"):
        parser.error("agent loops run against a loopback deployment only")
    tool = WeatherTool()
    if args.framework == "openai-agents":
        report = asyncio.run(openai_agents(args, tool))
    else:
        report = langgraph(args, tool)
    report.update({"framework": args.framework, "api": args.api, "stream": args.stream,
                   "tool_runs": tool.calls})
    json.dump(report, sys.stdout)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
