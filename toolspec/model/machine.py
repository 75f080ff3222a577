"""A one-line description of the machine a figure was measured on (benchmarks, cost curves)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import torch


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# Instruction sets that change how fast a model runs on a CPU beyond what torch's capability
# level says: with them bf16 matmuls run natively, without them they are emulated.
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile")


def cpu_features() -> str:
    """torch's CPU kernel level (``AVX2``, ``AVX512``, ...) and any bf16 instruction set: two
    CPUs with the same model name can differ here (and run bf16 10x apart)."""
    flags: set[str] = set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = set(line.split(":", 1)[1].split())
                break
    except OSError:
        pass
    return " ".join((torch.backends.cpu.get_cpu_capability(),
                     *(flag for flag in BF16_CPU_FLAGS if flag in flags)))


def describe_machine(device: torch.device) -> str:
    """One line naming the accelerator (or CPU, its kernel level and bf16 instructions), the
    OS and torch; cost curves are cached per line, so what changes the speed belongs in it."""
    if device.type == "cuda":
        accelerator = torch.cuda.get_device_name(device)
    else:
        accelerator = (f"{cpu_model()} ({cpu_features()}), {os.cpu_count()} cores, "
                       f"{torch.get_num_threads()} torch threads")
    return f"{accelerator}; {platform.system()} {platform.machine()}; torch {torch.__version__}"
