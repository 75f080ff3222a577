"""Are the ToolSpec proposer's outputs on vLLM exactly vLLM plain's? Token by token, with the
margin of every difference.

Two engines of the same settings in one process (``deployments.replica.vllm_engine``): one drafting
with the ToolSpec proposer, one plain. The plain one decodes every request alone, keeping the
log-probabilities of its top two tokens at each position; the ToolSpec one decodes them alone
and ``--concurrency`` at a time (batches change vLLM's kernels' shapes). Per request: identical
token ids or not; per difference, the first position where they part, the two tokens, and plain
decoding's log-probability gap between its first and second choice there (a near-tie when the
gap is within bf16's rounding of a logit, a few hundredths).

Greedy speculative decoding on vLLM keeps the target's argmax at every position, so an output
can only differ where a forward over a draft (several rows) rounds a logit differently from a
one-row forward — in bf16 on CPU, at near-ties; in fp32, never
(``tests/serving/replica/test_vllm_engine.py``).
vLLM's batch-invariant mode (``--batch-invariant``: ``VLLM_BATCH_INVARIANT=1``) needs its Triton
kernels, i.e. a GPU.

    .venv/bin/python scripts/vllm_lossless.py --out results/vllm-lossless     # bf16, ~10 min
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from deployments.messages import ChatRequest
from deployments.replica.engine import EngineSettings
from toolspec.bench.datasets import load_dataset
from toolspec.calls.tools import ToolSet
from toolspec.model.packages import DEFAULT_MODEL


def requests(specs: list[str], max_tokens: int) -> list[ChatRequest]:
    """Held-out items (``DATA@SKIP:N``) as chat requests offering their tools."""
    found = []
    for spec in specs:
        data, _, count = spec.rpartition(":")
        name, _, skip = data.partition("@")
        for item in load_dataset(name, limit=int(count), skip=int(skip or 0)):
            tools = [tool.openai() for tool in item.tools] if item.tools else []
            found.append(ChatRequest(
                request_id=item.id, model=DEFAULT_MODEL, messages=tuple(item.messages),
                tools=ToolSet.from_openai(tools) if tools else None, openai_tools=tuple(tools),
                max_tokens=max_tokens, tenant="lossless"))
    return found


async def decode(engine: Any, request: ChatRequest, logprobs: int | None
                 ) -> tuple[list[int], list[dict[int, float]]]:
    """``request``'s token ids on ``engine`` (and each position's top log-probabilities)."""
    plan = engine.plan(request)
    params = engine.sampling_params(request, plan, None)
    params.logprobs = logprobs
    from vllm.inputs import TokensPrompt

    tokens: list[int] = []
    tops: list[dict[int, float]] = []
    prompt = TokensPrompt(prompt_token_ids=list(plan.prompt_ids))
    async for out in engine.engine.generate(prompt, params, f"{request.request_id}-{id(params)}"):
        completion = out.outputs[0]
        tokens.extend(completion.token_ids)
        for position in completion.logprobs or ():
            tops.append({token: entry.logprob for token, entry in position.items()})
    return tokens, tops


def difference(plain: list[int], tops: list[dict[int, float]], other: list[int]
               ) -> dict[str, Any] | None:
    """Where ``other`` parts from ``plain`` and plain's top-two gap there (None: identical)."""
    if plain == other:
        return None
    at = next((i for i, (a, b) in enumerate(zip(plain, other)) if a != b),
              min(len(plain), len(other)))
    gap = None
    if at < len(tops) and len(tops[at]) >= 2:
        first, second = sorted(tops[at].values(), reverse=True)[:2]
        gap = first - second
    return {"position": at, "plain": plain[at] if at < len(plain) else None,
            "toolspec": other[at] if at < len(other) else None, "logprob_gap": gap}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from deployments.replica.vllm_engine import VLLMChatEngine

    base = EngineSettings(model=args.model, dtype=args.dtype, engine="vllm",
                          speculative_tokens=args.k, kv_cache_gib=args.kv_cache_gib,
                          compile=not args.eager, cpu_threads=args.threads)
    plain_engine = VLLMChatEngine(base.updated({"speculative_method": "none"}))
    toolspec_engine = VLLMChatEngine(base.updated({"speculative_method": "toolspec"}))
    items = requests(args.data, args.max_tokens)
    try:
        await toolspec_engine.ready()  # the proposer attached: requests below go past open()
        plain = [await decode(plain_engine, r, 2) for r in items]
        alone = [(await decode(toolspec_engine, r, None))[0] for r in items]
        batched: list[list[int]] = []
        for start in range(0, len(items), args.concurrency):
            group = items[start:start + args.concurrency]
            batched += [tokens for tokens, _ in await asyncio.gather(
                *(decode(toolspec_engine, r, None) for r in group))]
        proposer = await toolspec_engine.proposer_stats()  # that it drafted, and how well
    finally:
        plain_engine.close()
        toolspec_engine.close()
    rows = []
    for request, (tokens, tops), one, many in zip(items, plain, alone, batched):
        rows.append({"request": request.request_id, "tokens": len(tokens),
                     "alone": difference(tokens, tops, one),
                     f"batched_{args.concurrency}": difference(tokens, tops, many)})
    summary = {}
    for mode in ("alone", f"batched_{args.concurrency}"):
        differing = [row[mode] for row in rows if row[mode] is not None]
        summary[mode] = {"identical": len(rows) - len(differing), "requests": len(rows),
                         "largest_gap_at_a_difference": max(
                             (d["logprob_gap"] for d in differing
                              if d["logprob_gap"] is not None), default=None)}
    summary["proposer"] = {key: (proposer or {}).get(key) for key in (
        "chains", "drafted", "accepted", "failed_requests")}
    return {"settings": vars(args) | {"out": str(args.out)}, "summary": summary, "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=DEFAULT_MODEL)
    parser.add_argument("--dtype", default="bf16")
    parser.add_argument("--k", type=int, default=16, help="the proposer's longest chain")
    parser.add_argument("--data", action="append", default=None,
                        help="DATA@SKIP:N (default apibank:level-1@200:40 and "
                             "bfcl:live_simple:20; neither was tuned on)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--kv-cache-gib", type=float, default=2.0)
    parser.add_argument("--threads", default="auto")
    parser.add_argument("--eager", action="store_true", help="no graph compilation")
    parser.add_argument("--batch-invariant", action="store_true",
                        help="vLLM's batch-invariant kernels (VLLM_BATCH_INVARIANT=1; GPU)")
    parser.add_argument("--out", type=Path, default=Path("results/vllm-lossless"))
    args = parser.parse_args()
    args.data = args.data or ["apibank:level-1@200:40", "bfcl:live_simple:20"]
    if args.batch_invariant:
        os.environ["VLLM_BATCH_INVARIANT"] = "1"
    result = asyncio.run(main_async(args))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "lossless.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    for row in result["rows"]:
        for mode, found in row.items():
            if isinstance(found, dict):
                print(f"{row['request']} {mode}: differs at token {found['position']} "
                      f"(plain {found['plain']}, toolspec {found['toolspec']}), plain's top-two "
                      f"log-probability gap there {found['logprob_gap']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
