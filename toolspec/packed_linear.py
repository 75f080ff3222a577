"""Verification-sized matrix products on CPU: weights prepacked once for a few row counts.

A verification forward runs every linear layer on a handful of rows (the root plus the draft
nodes). On x86 CPUs, MKL's fp32 ``linear`` takes a slow path from 4 rows up: it repacks the
weight on every call, so verifying 8 tokens of the default model costs about three plain steps
although it reads the same weights. Packing each weight once for a fixed row count (MKL's
packed GEMM, the routine PyTorch's own CPU compiler uses for frozen weights) and padding the rows
up to that count makes 4–16 rows cost about 1.3–1.6 plain steps instead, which lets the draft
budget afford trees twice as large.

One and up to three rows, prefill and anything larger than the biggest pack keep the stock
kernel: plain decoding (``ar``) runs exactly as before, with its fastest path. Each padded row
is computed independently of the padding and of the other rows, so a draft node's logits do not
depend on the rest of its tree.

Cost: one packed copy of every weight per row count (about as much memory as the weights
again: 2 GB for the 0.5B default model in fp32), made in a second or two when the model loads.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

# Row counts with a packed copy; a call pads up to the smallest that fits.
DEFAULT_PACKED_ROWS: tuple[int, ...] = (8, 16)
# Up to this many rows the stock kernel is as fast as a packed one (measured, 0.5B fp32).
STOCK_KERNEL_MAX_ROWS = 3


def normalize_packed_rows(packed_rows: Sequence[int]) -> tuple[int, ...]:
    """``packed_rows`` sorted without repeats; ValueError if any is a stock-kernel size."""
    rows = tuple(sorted(set(packed_rows)))
    if rows and rows[0] <= STOCK_KERNEL_MAX_ROWS:
        raise ValueError(f"packed row counts must be above {STOCK_KERNEL_MAX_ROWS}, "
                         f"got {list(rows)}")
    return rows


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True where packed weights pay and exist: fp32 on a CPU build of torch with MKL."""
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkl.is_available()
        and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")
    )


class PackedLinear(nn.Module):
    """``nn.Linear`` whose 4–max-rows calls use weights prepacked for a fixed row count.

    Holds the original ``weight``/``bias`` parameters (same objects, so the state dict and
    tied embeddings are unchanged) plus one packed buffer per row count.
    """

    def __init__(self, linear: nn.Linear, packed_rows: Sequence[int]) -> None:
        super().__init__()
        rows = normalize_packed_rows(packed_rows)
        if not rows:
            raise ValueError("a PackedLinear needs at least one packed row count")
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.packed_rows = rows
        with torch.no_grad():
            self._packed = [
                torch.ops.mkl._mkl_reorder_linear_weight(linear.weight.detach(), count)
                for count in rows
            ]

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        flat = inputs.reshape(-1, self.in_features)
        count = flat.shape[0]
        if count <= STOCK_KERNEL_MAX_ROWS or count > self.packed_rows[-1]:
            return F.linear(inputs, self.weight, self.bias)
        slot = next(i for i, rows in enumerate(self.packed_rows) if rows >= count)
        rows = self.packed_rows[slot]
        if count < rows:
            flat = torch.cat([flat, flat.new_zeros(rows - count, self.in_features)])
        out = torch.ops.mkl._mkl_linear(flat, self._packed[slot], self.weight, self.bias, rows)
        return out[:count].reshape(*inputs.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, packed_rows={self.packed_rows}"
        )


def pack_linear_layers(model: nn.Module, packed_rows: Sequence[int] = DEFAULT_PACKED_ROWS) -> int:
    """Replace every ``nn.Linear`` of ``model`` by a ``PackedLinear``; return how many.

    Mutates: ``model``'s submodules (weights are shared, not copied; packed copies are added).
    Call it only where ``packing_available`` holds and only on a model used for inference.
    """
    targets = [(name, module) for name, module in model.named_modules()
               if type(module) is nn.Linear]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, PackedLinear(module, packed_rows))
    return len(targets)
