"""A replica's tensor-parallel group: the Serve replica is rank 0, N-1 worker actors the rest.

The pattern Ray Serve LLM and vLLM's Ray executor use: the deployment asks Serve for a
placement group per replica (``placement_group_bundles``, ``STRICT_PACK``: one node); the
replica runs in bundle 0 and starts one worker actor on each other bundle
(``PlacementGroupSchedulingStrategy``). Rank 0 picks a free port on its node, every rank joins
``torch.distributed`` there (gloo on CPU, NCCL on GPUs) and loads its shards; the workers then
``follow`` rank 0's plans until it closes the group. The workers are the replica's children:
when the replica dies, Ray ends them with it; when a worker dies, ``alive`` turns false, the
replica's health check fails, and Serve replaces the replica (and so the whole group).
"""

from __future__ import annotations

import logging
import socket
from dataclasses import dataclass

import ray
import torch
from ray.util.placement_group import get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from toolspec.model.loading import LoadedModel, load_model
from toolspec.model.tensor_parallel import (
    ParallelGroup,
    ShardedTarget,
    TensorParallelError,
    follow,
    init_group,
)

logger = logging.getLogger(f"ray.serve.{__name__}")

COLLECTIVE_TIMEOUT_S = 120.0  # a forward's all-reduce waits this long for a lost rank
WORKER_NAME_PREFIX = "toolspec-rank"  # + "<rank>-<the replica's actor id>"


@dataclass(frozen=True)
class RankSettings:
    """What every rank loads and how it joins."""

    model: str
    dtype: str
    size: int
    address: str
    port: int
    backend: str


class RankWorker:
    """Ranks 1..N-1 (a Ray actor): ``run`` joins the group, loads this rank's shards and
    follows rank 0 until it closes the group."""

    def __init__(self, rank: int, settings: RankSettings) -> None:
        self.rank = rank
        self.settings = settings

    def run(self) -> None:
        torch.set_num_threads(max(1, int(ray.get_runtime_context().get_assigned_resources()
                                         .get("CPU", 1))))
        loaded, group = join_and_load(self.rank, self.settings)
        follow(loaded.model, group)


def join_and_load(rank: int, settings: RankSettings) -> tuple[LoadedModel, ParallelGroup]:
    # Ray shows each actor only its own GPUs: every rank's device is its first (LOCAL_RANK 0).
    group = init_group(rank, settings.size, settings.address, settings.port, settings.backend,
                       collective_timeout_s=COLLECTIVE_TIMEOUT_S, local_rank=0)
    loaded = load_model(settings.model, settings.dtype, prepack_linear=False,
                        tensor_parallel_size=settings.size)
    return loaded, group


class TensorParallelGroup:
    """Rank 0's side of the group, inside the Serve replica. Mutates: the worker actors."""

    def __init__(self, model: str, dtype: str, size: int) -> None:
        placement = get_current_placement_group()
        if placement is None:
            raise TensorParallelError(
                "tensor_parallel_size > 1 needs the replica to run in a placement group of "
                "that many bundles (the builder sets placement_group_bundles)")
        if len(placement.bundle_specs) < size:
            raise TensorParallelError(
                f"the replica's placement group has {len(placement.bundle_specs)} bundles; "
                f"tensor_parallel_size {size} needs one per rank")
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        address = ray.util.get_node_ip_address()
        self.settings = RankSettings(model, dtype, size, address, _free_port(address), backend)
        worker = ray.remote(RankWorker)
        owner = ray.get_runtime_context().get_actor_id() or "driver"
        self.workers = []
        for rank in range(1, size):
            bundle = placement.bundle_specs[rank]
            self.workers.append(worker.options(
                name=f"{WORKER_NAME_PREFIX}{rank}-{owner[:16]}",  # ops can find (and kill) it
                num_cpus=bundle.get("CPU", 0), num_gpus=bundle.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement, placement_group_bundle_index=rank),
            ).remote(rank, self.settings))
        self.runs = [handle.run.remote() for handle in self.workers]
        self.loaded, self.group = join_and_load(0, self.settings)
        self.target = ShardedTarget(self.loaded.model, self.group)
        logger.info("tensor-parallel group of %d ranks on %s:%d (%s) is up", size, address,
                    self.settings.port, backend)

    def alive(self) -> bool:
        """Whether every worker still follows (a finished ``run`` means it died or failed)."""
        finished, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        return not finished

    def close(self) -> None:
        """Release the workers and leave the group. Idempotent."""
        try:
            self.target.close()
        except TensorParallelError as error:
            logger.warning("closing the tensor-parallel group: %s", error)
        for handle in self.workers:
            ray.kill(handle)
        if torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()


def _free_port(address: str) -> int:
    with socket.socket() as probe:
        probe.bind((address, 0))
        return probe.getsockname()[1]

