"""Verification forward cost at tensor-parallel size 1 vs N on this machine.

Runs ``measure_cost_curve`` on the whole model in this process, then on the model split over
N ranks (spawned here; rank 0 measures while the others follow), one after the other — never
both at once — and prints both curves, their ratio, and writes them as JSON.

    .venv/bin/python scripts/tensor_parallel_cost.py --model qwen2.5-coder-0.5b --dtype bf16 \
        --size 2 --json results/tp-cost.json

``--threads`` is each rank's thread count; the whole model gets ``size`` times as many, so
both use the same cores.
"""

from __future__ import annotations

import argparse
import json
import socket
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp
from transformers import AutoModelForCausalLM

from toolspec.model.cost_curve import DEFAULT_SIZES, format_cost_curve, measure_cost_curve
from toolspec.model.loading import parse_dtype
from toolspec.model.packages import resolve_model_dir
from toolspec.model.target_model import TargetModel


def _rank(rank: int, size: int, port: int, path: str, dtype: str, threads: int,
          sizes: tuple[int, ...], results: Any) -> None:
    from toolspec.model.tensor_parallel import ShardedTarget, follow, init_group, load_sharded

    torch.set_num_threads(threads)
    group = init_group(rank, size, "127.0.0.1", port, "gloo")
    model = load_sharded(path, size, parse_dtype(dtype, torch.device("cpu")))
    if rank:
        follow(model, group)
        return
    target = ShardedTarget(model, group)
    try:
        results.put(measure_cost_curve(target, sizes=sizes))
    finally:
        target.close()


def split_curve(path: str, size: int, dtype: str, threads: int, sizes: tuple[int, ...]
                ) -> dict[int, float]:
    context = mp.get_context("spawn")
    results = context.Queue()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ranks = [context.Process(target=_rank, args=(rank, size, port, path, dtype, threads, sizes,
                                                  results)) for rank in range(size)]
    for process in ranks:
        process.start()
    curve = results.get(timeout=1800)
    for process in ranks:
        process.join(timeout=120)
    return curve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    parser.add_argument("--size", type=int, default=2, help="ranks of the split model")
    parser.add_argument("--threads", type=int, default=1, help="threads per rank")
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES[:12])))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    sizes = tuple(int(k) for k in args.sizes.split(","))

    torch.set_num_threads(args.threads * args.size)
    path = str(resolve_model_dir(args.model))
    # The weights as the ranks load them, whole (no packing: split models run stock kernels).
    whole_model = AutoModelForCausalLM.from_pretrained(
        path, dtype=parse_dtype(args.dtype, torch.device("cpu")), attn_implementation="sdpa")
    whole = measure_cost_curve(TargetModel(whole_model.eval()), sizes=sizes)
    del whole_model
    split = split_curve(path, args.size, args.dtype, args.threads, sizes)
    print(f"TP=1 ({args.threads * args.size} threads)\n{format_cost_curve(whole)}\n")
    print(f"TP={args.size} ({args.threads} thread(s) per rank, gloo)\n"
          f"{format_cost_curve(split)}\n")
    print(f"{'k':>5}{'TP=' + str(args.size) + ' / TP=1':>14}")
    for k in sizes:
        print(f"{k:>5}{split[k] / whole[k]:>14.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "model": args.model, "dtype": args.dtype, "size": args.size,
            "threads_per_rank": args.threads, "seconds_tp1": whole,
            f"seconds_tp{args.size}": split}, indent=2))


if __name__ == "__main__":
    main()
