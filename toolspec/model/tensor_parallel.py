"""Tensor-parallel target models: one model held by N ranks, each with 1/N of every layer.

The model is sharded by transformers' own tensor parallelism (the architecture's TP plan:
q/k/v/gate/up split by output columns, o/down by input rows with an all-reduce after them,
the LM head's logits gathered), so every rank runs the same forward over its own attention
heads and ends with the same logits. Rank 0 runs the engine — drafting, the budget, sampling,
stop rules — on a ``ShardedTarget``; ranks 1..N-1 run ``follow``. Each rank holds its heads'
part of every KV cache, so the caches are mirrored: rank 0 names each cache it creates, and
before every forward broadcasts a ``Plan`` — the cache operations since the last forward
(created, committed, truncated, freed; prefix-cache blocks saved, loaded, dropped), then the
forward's rows — which every other rank replays on its own caches. One broadcast per forward;
nothing comes back. The prefix cache's index lives on rank 0 only; each rank keeps its own
heads' part of every cached block.

Two process groups: the plan group waits as long as rank 0 idles between requests (a long
timeout), the model's collectives inside a forward fail after ``collective_timeout_s``, so a
dead rank ends its replica instead of hanging it.
"""

from __future__ import annotations

import datetime
import itertools
import os
import threading
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import DynamicCache, PreTrainedModel

from toolspec.core.draft_tree import DraftTree
from toolspec.core.forward import SequenceRows
from toolspec.core.prefix_cache import DEFAULT_BLOCK_TOKENS
from toolspec.model.target_model import (
    StoredBlock,
    TargetModel,
    append_rows,
    check_batch,
    commit_path,
    copy_rows,
    truncate_cache,
)

IDLE_TIMEOUT = datetime.timedelta(days=7)  # the plan group: rank 0 may wait this long for work


class TensorParallelError(RuntimeError):
    """A tensor-parallel group that cannot be formed or has lost a rank."""


@dataclass(frozen=True)
class ParallelGroup:
    """This process's place in a tensor-parallel group and the groups it talks in."""

    rank: int
    size: int
    plans: Any  # the process group rank 0's plans are broadcast in (gloo, long timeout)


def init_group(rank: int, size: int, address: str, port: int, backend: str = "gloo",
               collective_timeout_s: float = 120.0, local_rank: int | None = None
               ) -> ParallelGroup:
    """Join the group of ``size`` ranks whose rank 0 listens on ``address:port``.

    ``backend``: gloo on CPU, nccl on GPUs (the model's collectives); plans always go over gloo
    (they are Python objects). ``local_rank``: this rank's device index on its node (default:
    ``rank``; 0 where each process sees only its own GPU, as under Ray). Mutates: this
    process's default ``torch.distributed`` group and its RANK, WORLD_SIZE and LOCAL_RANK
    environment variables (transformers places the shards by them).
    """
    if not 0 <= rank < size:
        raise TensorParallelError(f"rank {rank} is outside a group of {size}")
    os.environ["LOCAL_RANK"] = str(rank if local_rank is None else local_rank)
    os.environ["WORLD_SIZE"] = str(size)
    os.environ["RANK"] = str(rank)
    try:
        dist.init_process_group(backend, init_method=f"tcp://{address}:{port}", rank=rank,
                                world_size=size,
                                timeout=datetime.timedelta(seconds=collective_timeout_s))
        plans = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    except Exception as error:  # torch raises RuntimeError, ValueError or DistBackendError
        raise TensorParallelError(
            f"rank {rank} of {size} could not join the group at {address}:{port}: {error}"
        ) from error
    return ParallelGroup(rank, size, plans)


def load_sharded(path: str | Path, size: int, dtype: torch.dtype,
                 loader: Callable[..., PreTrainedModel] | None = None) -> PreTrainedModel:
    """The model at ``path`` with this rank's shards (after ``init_group``), in eval mode."""
    from transformers import AutoModelForCausalLM, DistributedConfig

    load = loader or AutoModelForCausalLM.from_pretrained
    model = load(str(path), dtype=dtype, attn_implementation="sdpa",
                 distributed_config=DistributedConfig(tp_size=size, tp_plan="auto"))
    return model.eval()


def check_divides(config: Any, size: int) -> None:
    """Raise ValueError unless ``size`` ranks can split ``config``'s heads evenly."""
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if size < 1 or kv_heads % size or config.num_attention_heads % size:
        raise ValueError(
            f"tensor_parallel_size {size} must divide the model's {kv_heads} key/value heads "
            f"and {config.num_attention_heads} attention heads")


# ---- the plan ------------------------------------------------------------------------------

@dataclass(frozen=True)
class RowsPlan:
    """One sequence's rows of a forward, as the other ranks rebuild them."""

    cache: int
    pending: tuple[int, ...]
    tree: DraftTree
    logits: bool
    prompt: bool


@dataclass
class Plan:
    """What the other ranks do before and in the next forward, in order."""

    operations: list[tuple[Any, ...]] = field(default_factory=list)  # ("new"|"commit"|...)
    rows: tuple[RowsPlan, ...] = ()
    stop: bool = False
    block_tokens: int = DEFAULT_BLOCK_TOKENS  # rank 0's prompt blocks (``TargetModel``)


class MirroredCache(DynamicCache):
    """A KV cache whose copies on the other ranks go by ``mirror_id``."""

    mirror_id: int


class ShardedTarget(TargetModel):
    """Rank 0's target model: ``TargetModel`` whose forwards and cache operations the other
    ranks repeat. Mutates: its queue of operations not yet sent."""

    def __init__(self, model: PreTrainedModel, group: ParallelGroup) -> None:
        super().__init__(model)
        if group.rank != 0:
            raise TensorParallelError("only rank 0 drives the group; the others `follow`")
        self.group = group
        self._ids = itertools.count()  # next() is atomic: caches are made on several threads
        # Appended from any thread (a cache's finalizer runs wherever its last reference
        # goes; requests open on the event loop, forwards run on the scheduler's thread):
        # deque appends and pops are atomic, and operations on different caches commute.
        self._queued: deque[tuple[Any, ...]] = deque()
        self._closed = False
        # A forward's broadcast and its collectives, or the closing broadcast: one at a time
        # (close may come from another thread while the scheduler's forward runs).
        self._group_lock = threading.Lock()

    def new_cache(self) -> DynamicCache:
        cache = MirroredCache(config=self.model.config)
        cache.mirror_id = next(self._ids)
        self._queued.append(("new", cache.mirror_id))
        # A cache rank 0 lets go of is dropped on the others with the next plan.
        weakref.finalize(cache, self._free, cache.mirror_id)
        return cache

    def _free(self, mirror_id: int) -> None:
        self._queued.append(("free", mirror_id))

    def commit_path(self, cache: DynamicCache, base_length: int, kept_rows: Sequence[int]
                    ) -> None:
        self._queued.append(("commit", _mirror_id(cache), base_length, tuple(kept_rows)))
        commit_path(cache, base_length, kept_rows)

    def truncate(self, cache: DynamicCache, length: int) -> None:
        self._queued.append(("truncate", _mirror_id(cache), length))
        truncate_cache(cache, length)

    def save_block(self, cache: DynamicCache, start: int, end: int) -> StoredBlock:
        block = StoredBlock(copy_rows(cache, start, end).layers, next(self._ids))
        self._queued.append(("save", _mirror_id(cache), block.mirror_id, start, end))
        return block

    def load_blocks(self, cache: DynamicCache, blocks: Sequence[StoredBlock]) -> None:
        self._queued.append(("load", _mirror_id(cache),
                             tuple(_block_id(block) for block in blocks)))
        append_rows(cache, blocks)

    def drop_block(self, block: StoredBlock) -> None:
        self._queued.append(("drop", _block_id(block)))

    def forward(self, batch: Sequence[SequenceRows]) -> list[torch.Tensor | None]:
        # Checked before the broadcast: once the others have the plan, rank 0 must run it too.
        check_batch(batch)
        rows = tuple(RowsPlan(_mirror_id(r.cache), r.pending, r.tree, r.logits, r.prompt)
                     for r in batch)
        with self._group_lock:
            if self._closed:
                raise TensorParallelError("the tensor-parallel group was closed")
            _broadcast(Plan(self._take_queue(), rows, block_tokens=self.block_tokens),
                       self.group)
            return super().forward(batch)

    def close(self) -> None:
        """Release the other ranks (their ``follow`` returns), after a forward in flight.
        Idempotent."""
        with self._group_lock:
            if not self._closed:
                self._closed = True
                _broadcast(Plan(self._take_queue(), stop=True), self.group)

    def _take_queue(self) -> list[tuple[Any, ...]]:
        taken = []
        while self._queued:
            taken.append(self._queued.popleft())
        return taken


def follow(model: PreTrainedModel, group: ParallelGroup) -> None:
    """Ranks 1..N-1: repeat rank 0's plans on this rank's shards until it closes the group.
    Mutates: this rank's mirrored caches. Raises TensorParallelError if rank 0 is lost."""
    target = TargetModel(model)
    caches: dict[int, DynamicCache] = {}
    blocks: dict[int, StoredBlock] = {}
    while True:
        plan = _receive(group)
        for operation in plan.operations:
            _replay(operation, caches, blocks, target)
        if plan.stop:
            return
        target.block_tokens = plan.block_tokens
        target.forward([SequenceRows(caches[rows.cache], rows.pending, rows.tree, rows.logits,
                                     rows.prompt)
                        for rows in plan.rows])


def _replay(operation: tuple[Any, ...], caches: dict[int, DynamicCache],
            blocks: dict[int, StoredBlock], target: TargetModel) -> None:
    kind, name, *arguments = operation
    if kind == "new":
        caches[name] = target.new_cache()
    elif kind == "commit":
        commit_path(caches[name], *arguments)
    elif kind == "truncate":
        truncate_cache(caches[name], *arguments)
    elif kind == "free":
        caches.pop(name, None)
    elif kind == "save":
        block_id, start, end = arguments
        blocks[block_id] = copy_rows(caches[name], start, end)
    elif kind == "load":
        append_rows(caches[name], [blocks[block_id] for block_id in arguments[0]])
    elif kind == "drop":
        blocks.pop(name, None)
    else:
        raise TensorParallelError(f"unknown cache operation {kind!r} in a plan")


def _block_id(block: StoredBlock) -> int:
    if block.mirror_id is None:
        raise TensorParallelError("a block not saved by this ShardedTarget has no copies on "
                                  "the other ranks")
    return block.mirror_id


def _mirror_id(cache: DynamicCache) -> int:
    mirror_id = getattr(cache, "mirror_id", None)
    if mirror_id is None:
        raise TensorParallelError("a cache not made by this ShardedTarget's new_cache has no "
                                  "copies on the other ranks")
    return mirror_id


def _broadcast(plan: Plan, group: ParallelGroup) -> None:
    try:
        dist.broadcast_object_list([plan], src=0, group=group.plans)
    except Exception as error:  # a lost rank: gloo raises RuntimeError or DistBackendError
        raise TensorParallelError(f"a rank of the tensor-parallel group is lost: {error}"
                                  ) from error


def _receive(group: ParallelGroup) -> Plan:
    box: list[Any] = [None]
    try:
        dist.broadcast_object_list(box, src=0, group=group.plans)
    except Exception as error:
        raise TensorParallelError(f"rank 0 of the tensor-parallel group is lost: {error}"
                                  ) from error
    return box[0]
