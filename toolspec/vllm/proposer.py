"""ToolSpec as a vLLM speculative method: the proposer class vLLM loads, and the worker
extension that shows it which request each batch row is.

Serve with::

    AsyncLLM.from_engine_args(AsyncEngineArgs(
        model=..., speculative_config={"method": "custom_class",
                                       "model": "toolspec.vllm.proposer.ToolSpecProposer",
                                       "num_speculative_tokens": 16},
        worker_extension_cls="toolspec.vllm.proposer.ToolSpecWorkerExtension"))
    await engine.collective_rpc("attach_toolspec_proposer")  # once, before requests

and give each request ``SamplingParams(extra_args=DraftingRequest(...).to_extra_args())``
(``deployments.replica.vllm_engine`` does all of this).

vLLM calls ``propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)`` once per step with
the rows of its persistent batch and no request ids. The worker extension's
``attach_toolspec_proposer`` (a ``collective_rpc``, vLLM's public way to run code in its
workers) hands the proposer the worker's model runner, whose batch names each row's request and
whose request states hold each request's prompt and ``SamplingParams.extra_args``. Custom logits
processors, the other per-request channel, are refused by vLLM 0.32 while speculative decoding
is on. Until attached, the proposer drafts nothing (and says so once).

Settings the proposer cannot take from vLLM's config come from the environment of the process
that starts the engine (vLLM's processes inherit it): ``TOOLSPEC_PROPOSER_METHOD`` (the method of
requests that name none; default ``toolspec``), ``TOOLSPEC_PROPOSER_MIN_REACH`` (default 0.3) and
``TOOLSPEC_PROPOSER_TREE_NODES`` (default 4) and ``TOOLSPEC_PROPOSER_STEP_TOKENS`` (default:
none): see ``SessionSettings``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from toolspec.model.packages import load_tokenizer
from toolspec.vllm.request import DraftingRequest
from toolspec.vllm.sessions import DEFAULT_METHOD, DraftSessions, SessionSettings

logger = logging.getLogger(__name__)

PROPOSER_CLASS = "toolspec.vllm.proposer.ToolSpecProposer"
WORKER_EXTENSION_CLASS = "toolspec.vllm.proposer.ToolSpecWorkerExtension"
ATTACH_METHOD = "attach_toolspec_proposer"
STATS_METHOD = "toolspec_proposer_stats"


def session_settings(max_tokens: int, environment: Mapping[str, str]) -> SessionSettings:
    """The proposer's settings: ``max_tokens`` (vLLM's ``num_speculative_tokens``) and the
    ``TOOLSPEC_PROPOSER_*`` variables of ``environment`` (the module's docstring)."""
    return SessionSettings(
        max_tokens=max_tokens,
        method=environment.get("TOOLSPEC_PROPOSER_METHOD", DEFAULT_METHOD),
        min_reach=float(environment.get("TOOLSPEC_PROPOSER_MIN_REACH", "0.3")),
        tree_nodes=int(environment.get("TOOLSPEC_PROPOSER_TREE_NODES", "4")),
        step_tokens=_optional_int(environment.get("TOOLSPEC_PROPOSER_STEP_TOKENS")))


class ToolSpecProposer:
    """vLLM's ``custom_class`` proposer: one draft chain per running request per step, from the
    request's ToolSpec drafter (``DraftSessions``). Runs in vLLM's worker process, on its step
    thread. Mutates: its sessions."""

    def __init__(self, vllm_config: Any) -> None:
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        settings = session_settings(
            int(vllm_config.speculative_config.num_speculative_tokens), os.environ)
        self.sessions = DraftSessions(load_tokenizer(vllm_config.model_config.tokenizer),
                                      settings)
        self._runner: Any = None
        self._warned = False

    def load_model(self, model: Any) -> None:
        """vLLM's CPU runner calls this with the target model; drafts come from text, so there
        is nothing to load."""

    def attach(self, runner: Any) -> None:
        """Read request ids and states from ``runner`` (its ``input_batch`` and ``requests``)."""
        self._runner = runner

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: Any,
                token_ids_cpu: Any, slot_mappings: Any = None) -> list[list[int]]:
        """Per row of the batch, the draft chain after its tokens ``token_ids_cpu[i,
        :num_tokens_no_spec[i]]``; an empty one for a row still prefilling (nothing sampled),
        a request that fails to draft, or while unattached."""
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        if self._runner is None:
            if not self._warned:
                self._warned = True
                logger.warning("the ToolSpec proposer drafts nothing until %s runs on the "
                               "worker (collective_rpc)", ATTACH_METHOD)
            return drafts
        batch, states = self._runner.input_batch, self._runner.requests
        # Requests gone since the last step stop first: their drafters teach their tenant's
        # memory before a new request of that tenant starts.
        self.sessions.retire(batch.req_id_to_index.keys())
        running = batch.req_ids
        rows, asked = [], []
        for row, sampled in enumerate(sampled_token_ids):
            if not sampled:
                continue
            request_id = running[row]
            length = int(num_tokens_no_spec[row])
            if request_id not in self.sessions:
                self._start(request_id, states.get(request_id))
            rows.append(row)
            asked.append((request_id, token_ids_cpu[row, :length].tolist(),
                          self.max_model_len - length - 1))
        for row, draft in zip(rows, self.sessions.propose_batch(asked)):
            drafts[row] = draft
        return drafts

    def _start(self, request_id: str, state: Any) -> None:
        prompt = list(state.prompt_token_ids or ()) if state is not None else []
        params = state.sampling_params if state is not None else None
        try:
            request = DraftingRequest.from_extra_args(getattr(params, "extra_args", None))
        except ValueError as error:
            logger.warning("request %s: %s; drafting without it", request_id, error)
            request = None
        self.sessions.start(request_id, prompt, request)


class ToolSpecWorkerExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``): methods run through
    ``collective_rpc`` on every worker."""

    def attach_toolspec_proposer(self) -> bool:
        """Show the ToolSpec proposer this worker's model runner; False where the worker has
        none (another method, or a rank that does not draft)."""
        runner = getattr(self, "model_runner", None)
        proposer = getattr(runner, "drafter", None)
        if not isinstance(proposer, ToolSpecProposer):
            return False
        proposer.attach(runner)
        return True

    def toolspec_proposer_stats(self) -> dict[str, Any] | None:
        """The proposer's totals (``ProposerStats.as_dict``), None where there is none."""
        proposer = getattr(getattr(self, "model_runner", None), "drafter", None)
        if not isinstance(proposer, ToolSpecProposer):
            return None
        return {**proposer.sessions.stats.as_dict(), "running": len(proposer.sessions)}


def speculative_config(num_tokens: int) -> dict[str, Any]:
    """vLLM's ``speculative_config`` for the ToolSpec proposer."""
    return {"method": "custom_class", "model": PROPOSER_CLASS, "num_speculative_tokens": num_tokens}



def _optional_int(text: str | None) -> int | None:
    return int(text) if text not in (None, "", "none") else None
