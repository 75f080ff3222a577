"""A one-line description of the machine a benchmark ran on."""

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


def describe_machine(device: torch.device) -> str:
    if device.type == "cuda":
        accelerator = torch.cuda.get_device_name(device)
    else:
        accelerator = f"{cpu_model()}, {os.cpu_count()} cores, {torch.get_num_threads()} torch threads"
    return f"{accelerator}; {platform.system()} {platform.machine()}; torch {torch.__version__}"
