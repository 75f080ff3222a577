"""A model split over two CPU ranks (gloo) decodes as the whole model does.

Each test run spawns two processes: rank 0 drives a ``ShardedTarget`` and the engine, rank 1
``follow``s. The same scenario runs on the unsplit model in this process; greedy and seeded
sampled outputs must be identical, and logits equal within 1e-5 (the row-parallel layers
sum their halves in another order).
"""

from __future__ import annotations

import random
import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from helpers import REPO, ScriptedDrafter, ToyTokenizer, tiny_model
from transformers import AutoModelForCausalLM, Qwen2Config

from toolspec import Engine, GenerationParams, TargetModel
from toolspec.core.draft_tree import ROOT, DraftTree
from toolspec.core.prefix_cache import PrefixCache
from toolspec.core.sampling import SamplingParams
from toolspec.model.target_model import CacheOperations

VOCAB = 96
TREE = DraftTree(tokens=(5, 9, 11, 7, 30), parents=(ROOT, 0, 0, 1, ROOT),
                 sources=("t",) * 5)


def scenario(model: TargetModel) -> dict[str, Any]:
    """Tree verification + commit + steps, a session cut back, and engine generations (greedy,
    sampled, batched) on ``model``; what each produced."""
    torch.manual_seed(0)
    out: dict[str, Any] = {"logits": []}
    cache = model.new_cache()
    out["logits"].append(model.forward_tree(cache, list(range(10, 40)), TREE))
    model.commit_path(cache, 29, [0, 2])  # root and node 1 accepted
    for pending in ([9], [44]):
        out["logits"].append(model.forward_tree(cache, pending, TREE))
        model.commit_path(cache, cache.get_seq_length() - len(TREE) - 1, [0, 1, 4])
    model.truncate(cache, 20)  # a session's cache cut to a shorter prompt
    out["logits"].append(model.forward_tree(cache, [12, 13, 14], TREE))
    del cache  # its copy on the other rank is freed with the next plan

    engine = Engine(model, ToyTokenizer(), budget=10, stop_token_ids=[3])
    rng = random.Random(1)
    prompts = [[rng.randrange(4, VOCAB) for _ in range(rng.randint(3, 40))] for _ in range(4)]
    greedy = GenerationParams(max_new_tokens=30)
    plain = [engine.generate(prompt, None, greedy).tokens for prompt in prompts]
    out["greedy"] = plain
    out["speculative"] = [engine.generate(p, ScriptedDrafter(t, VOCAB, seed), greedy).tokens
                          for seed, (p, t) in enumerate(zip(prompts, plain))]
    sampled = GenerationParams(max_new_tokens=30,
                               sampling=SamplingParams(temperature=0.8, seed=7))
    out["sampled"] = [engine.generate(p, ScriptedDrafter(t, VOCAB, 3), sampled).tokens
                      for p, t in zip(prompts, plain)]
    jobs = [engine.start(p, ScriptedDrafter(t, VOCAB, 5), greedy) for p, t in zip(prompts, plain)]
    out["batched"] = [g.tokens for g in engine.run(jobs)]

    # The prefix cache: blocks saved, taken and (in the tiny one) dropped on every rank.
    model.block_tokens = 8
    system = [rng.randrange(4, VOCAB) for _ in range(30)]
    shared = [[*system, *(rng.randrange(4, VOCAB) for _ in range(rng.randint(2, 12)))]
              for _ in range(4)]
    out["unshared"] = [engine.generate(p, None, greedy).tokens for p in shared]
    for name, budget_bytes in (("cached", 1 << 30), ("evicting", 1)):
        cached = Engine(model, ToyTokenizer(), budget=10, stop_token_ids=[3], step_rows=24,
                        prefix_cache=PrefixCache(model, budget_bytes, 8))
        first = cached.generate(shared[0], None, greedy)
        rest = cached.run([cached.start(p, None, greedy) for p in shared[1:]])
        out[name] = [g.tokens for g in (first, *rest)]
        out[f"{name}_tokens"] = [g.cached_tokens for g in (first, *rest)]
    return out


def _rank(rank: int, port: int, path: str, results: Any) -> None:
    torch.set_num_threads(1)
    from toolspec.model.tensor_parallel import ShardedTarget, follow, init_group, load_sharded

    group = init_group(rank, 2, "127.0.0.1", port, "gloo", collective_timeout_s=60)
    model = load_sharded(path, 2, torch.float32)
    if rank:
        follow(model, group)
        results.put(("follower", "done"))
        return
    target = ShardedTarget(model, group)
    try:
        out = scenario(target)
        # As lists: a tensor would travel in shared memory this process frees when it exits.
        out["logits"] = [logits.tolist() for logits in out["logits"]]
        results.put(("leader", out))
    finally:
        target.close()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_split(path: Path) -> dict[str, Any]:
    context = mp.get_context("spawn")
    results = context.Queue()
    port = free_port()
    ranks = [context.Process(target=_rank, args=(rank, port, str(path), results))
             for rank in range(2)]
    for process in ranks:
        process.start()
    got = dict(results.get(timeout=240) for _ in ranks)
    for process in ranks:
        process.join(timeout=60)
        assert process.exitcode == 0
    assert got["follower"] == "done"
    return got["leader"]


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tp") / "tiny-qwen2"
    tiny_model("qwen2", VOCAB).save_pretrained(path)
    return path


def test_two_ranks_decode_as_the_whole_model(saved_model: Path) -> None:
    whole = TargetModel(AutoModelForCausalLM.from_pretrained(
        saved_model, dtype=torch.float32, attn_implementation="sdpa").eval())
    expected = scenario(whole)
    split = run_split(saved_model)
    for listed, want in zip(split["logits"], expected["logits"], strict=True):
        got = torch.tensor(listed)
        assert got.shape == want.shape
        assert torch.allclose(got, want, atol=1e-5, rtol=0)
    for key in ("greedy", "speculative", "sampled", "batched", "cached", "cached_tokens",
                "evicting"):
        assert split[key] == expected[key], key
    assert split["speculative"] == split["greedy"] == split["batched"]
    assert split["cached"] == split["evicting"] == split["unshared"]
    assert split["cached_tokens"] == [0, 24, 24, 24] and split["evicting_tokens"] == [0] * 4


def test_head_counts_the_ranks_cannot_split_are_refused() -> None:
    from toolspec.model.tensor_parallel import check_divides

    config = Qwen2Config(num_attention_heads=14, num_key_value_heads=2)
    check_divides(config, 2)
    with pytest.raises(ValueError, match="must divide the model's 2 key/value heads"):
        check_divides(config, 4)


def test_a_sharded_target_refuses_caches_it_did_not_make() -> None:
    from toolspec.model.tensor_parallel import TensorParallelError, _mirror_id

    with pytest.raises(TensorParallelError, match="no copies on the other ranks"):
        _mirror_id(TargetModel(tiny_model("qwen2", VOCAB)).new_cache())
    assert issubclass(TargetModel, CacheOperations)


def test_the_cost_script_times_both_sizes_on_a_saved_model(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    saved = tmp_path / "tiny-qwen2"  # the cost curve draws tokens from 100 to vocab - 100
    tiny_model("qwen2", vocab_size=512).save_pretrained(saved)
    script = REPO / "scripts" / "tensor_parallel_cost.py"
    out = tmp_path / "tp-cost.json"
    done = subprocess.run([sys.executable, str(script), "--model", str(saved),
                           "--dtype", "fp32", "--sizes", "1,2", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert set(report["seconds_tp1"]) == set(report["seconds_tp2"]) == {"1", "2"}
    assert all(seconds > 0 for seconds in report["seconds_tp2"].values())
    assert "TP=2 / TP=1" in done.stdout
