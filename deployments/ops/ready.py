"""``python -m deployments.ops.ready``: wait until a deployed app answers, then show how to call it.

Ready means a one-token chat completion succeeds (the model replica is loaded), not merely
that the HTTP proxy is up.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request

EXAMPLES = """
ToolSpec is serving {model} at {url}/v1  (OpenAI-compatible)

curl:
  curl -s {url}/v1/chat/completions -H 'content-type: application/json' \\
    -H 'x-session-id: demo-1' -d '{{"model": "{model}",
      "messages": [{{"role": "user", "content": "What is the weather in Paris?"}}],
      "tools": [{{"type": "function", "function": {{"name": "get_weather",
        "parameters": {{"type": "object", "properties": {{"city": {{"type": "string"}}}},
                       "required": ["city"]}}}}}}]}}'

openai client (pip install openai):
  from openai import OpenAI
  client = OpenAI(base_url="{url}/v1", api_key="unused")
  reply = client.chat.completions.create(model="{model}", messages=[...], tools=[...],
                                         extra_headers={{"x-session-id": "demo-1"}})
  print(reply.choices[0].message.tool_calls)

Stop with: make stop
"""


def _post(url: str, payload: dict) -> int:
    request = urllib.request.Request(url, json.dumps(payload).encode(),
                                     {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        return response.status


def wait_ready(url: str, model: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    probe = {"model": model, "max_tokens": 1,
             "messages": [{"role": "user", "content": "Say hi."}]}
    while time.monotonic() < deadline:
        try:
            if _post(f"{url}/v1/chat/completions", probe) == 200:
                return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass  # proxy not up, app still deploying, or replica still loading
        time.sleep(2)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args(argv)
    print(f"waiting for {args.url} to answer (the first start converts the weights)...")
    if not wait_ready(args.url, args.model, args.timeout):
        print(f"not ready after {args.timeout:.0f} s; see `serve status` and "
              "/tmp/ray/session_latest/logs/serve/", file=sys.stderr)
        return 1
    print(EXAMPLES.format(url=args.url, model=args.model))
    return 0


if __name__ == "__main__":
    sys.exit(main())
