"""fp32 linear layers on CPU with weights prepacked once for oneDNN.

A verification forward runs every linear layer on a handful of rows (the root plus the draft
nodes). PyTorch's stock fp32 ``linear`` on CPU is MKL's: one row takes a matrix-vector path,
two or more a GEMM that repacks the weight on every call, so on two AVX2 cores verifying 2–16
tokens of the default model costs 2–2.5 plain steps although it reads the same weights. oneDNN
with each weight reordered once, at load, into its blocked layout (what PyTorch's CPU compiler
does for frozen weights) verifies 8 tokens for about 1.0 and 16 for about 1.4 stock steps, and
runs a plain one-row step in ~25 % less time than MKL (measured on an AMD EPYC with AVX2;
docs/benchmarks-history.md, "oneDNN linear layers").

Every row count goes through the same primitive and weight layout, and a row's result does not
depend on how many rows the call has (tested; a single row is computed as two, since oneDNN's
one-row kernel rounds apart on AVX-512 CPUs): a draft node's logits are bitwise those of a
one-row decoding step at the same position, as far as the linear layers go, a prompt
prefilled together with a draft tree gets the same keys and values as one prefilled alone, and
a sequence batched with others gets the rows it would get alone.

Cost: one reordered copy of every weight (as much memory as the weights again: 2 GB for the
0.5B default model in fp32), made in a second or two when the model loads; a long prefill runs
~6 % slower than with MKL.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

# oneDNN picks the weight's blocked layout for this many rows; the layout then serves every row
# count (timed alternately: 128 gave a faster one-row step and prefill than 16).
_LAYOUT_ROWS = 128


# Exact bf16 (``exact_bf16``): every call runs in tiles of exactly this many rows. oneDNN's
# bf16 kernels round a row apart with the row count of the call (not with its position in the
# call, nor with what the other rows hold: docs/serving.md, "Exact bf16"), so a fixed tile gives
# a verification row bitwise the bits of a one-row step; 64 rows cost about a stock one-row
# call on an AMX Xeon.
EXACT_TILE_ROWS = 64


def cpu_supports_fast_bf16() -> bool:
    """True when this CPU has bf16 matrix instructions (AMX or AVX512-BF16).

    Without them PyTorch emulates bf16 matmuls and they run several times slower than fp32.
    """
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return any(flag in flags for flag in ("amx_bf16", "avx512_bf16"))


def exact_tiles_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True where fixed-tile bf16 linears exist and were measured row-independent: bf16 on a
    CPU with bf16 matrix instructions, in a build of torch with oneDNN."""
    return (device.type == "cpu" and dtype == torch.bfloat16 and cpu_supports_fast_bf16()
            and torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """True where prepacked weights pay and exist: fp32 on a CPU build of torch with oneDNN."""
    return (
        device.type == "cpu"
        and dtype == torch.float32
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )


class PackedLinear(nn.Module):
    """``nn.Linear`` computed by oneDNN from a copy of the weight in oneDNN's own layout.

    Holds the original ``weight``/``bias`` parameters (same objects, so the state dict and
    tied embeddings are unchanged) plus the reordered copy, an opaque oneDNN tensor kept out of
    the state dict (it cannot be saved or moved to another device: pack after loading, on the
    CPU, for inference only).
    """

    def __init__(self, linear: nn.Linear, tile_rows: int | None = None) -> None:
        super().__init__()
        self.in_features = linear.in_features
        self.out_features = linear.out_features
        self.weight = linear.weight
        self.bias = linear.bias
        self.tile_rows = tile_rows  # every call in tiles of exactly this many rows (exact bf16)
        with torch.no_grad():
            self._packed = torch.ops.mkldnn._reorder_linear_weight(
                linear.weight.detach(), tile_rows or _LAYOUT_ROWS)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        rows = inputs.numel() // self.in_features if self.in_features else 0
        if self.tile_rows is not None:
            return self._tiled(inputs, rows)
        if rows == 1:
            # oneDNN runs a single row through a kernel of its own, which on AVX-512 CPUs rounds
            # some layers apart from the same row among others (every count from 2 to 1,024
            # agrees); two rows cost the same, and then a decoding step's logits do not depend
            # on whether other rows (a batch) share its forward.
            doubled = inputs.expand(*inputs.shape[:-2], 2, self.in_features)
            return torch.ops.mkldnn._linear_pointwise(doubled, self._packed, self.bias, "none",
                                                      [], "")[..., :1, :]
        return torch.ops.mkldnn._linear_pointwise(inputs, self._packed, self.bias, "none", [], "")

    def _tiled(self, inputs: torch.Tensor, rows: int) -> torch.Tensor:
        """Every row through a call of exactly ``tile_rows`` rows (the last tile padded with
        zeros), so its bits do not depend on how many rows came with it."""
        tile = self.tile_rows
        flat = inputs.reshape(rows, self.in_features)
        padded = torch.nn.functional.pad(flat, (0, 0, 0, -rows % tile))
        outputs = [torch.ops.mkldnn._linear_pointwise(padded[start: start + tile], self._packed,
                                                      self.bias, "none", [], "")
                   for start in range(0, len(padded), tile)]
        joined = outputs[0] if len(outputs) == 1 else torch.cat(outputs)
        return joined[:rows].reshape(*inputs.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        tiles = f", in tiles of {self.tile_rows} rows" if self.tile_rows else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, prepacked for oneDNN{tiles}")


def pack_linear_layers(model: nn.Module, tile_rows: int | None = None) -> int:
    """Replace every ``nn.Linear`` of ``model`` by a ``PackedLinear``; return how many.
    ``tile_rows``: every call in tiles of that many rows (``EXACT_TILE_ROWS`` for exact bf16).

    Mutates: ``model``'s submodules (weights are shared, not copied; packed copies are added).
    Call it only where ``packing_available`` (or, with tiles, ``exact_tiles_available``) holds
    and only on a model used for inference.
    """
    targets = [(name, module) for name, module in model.named_modules()
               if type(module) is nn.Linear]
    for name, module in targets:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, PackedLinear(module, tile_rows))
    return len(targets)
