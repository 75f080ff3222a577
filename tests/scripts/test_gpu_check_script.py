"""``scripts/gpu_check.py`` rehearsed on the CPU (``--dry-run``: SmolLM2, a few items, seconds
of load): every phase runs to its end, writes its figures, and leaves no process behind — so
the script that will meet a GPU for a few minutes is known to work before it does."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO

pytestmark = [pytest.mark.ray, pytest.mark.real_model]


def ray_processes() -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if b"tsgpu-" in (entry / "cmdline").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def test_the_cpu_rehearsal_runs_every_phase_and_leaves_nothing_running(tmp_path: Path) -> None:
    out = tmp_path / "gpu-check"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--dry-run",
                           "--out", str(out)], capture_output=True, text=True, timeout=1500,
                          cwd=REPO)
    summary = json.loads((out / "summary.json").read_text())
    phases = {phase["name"]: phase for phase in summary["phases"]}
    assert done.returncode == 0, json.dumps(phases, indent=1)[-4000:]
    assert summary["mode"] == "cpu rehearsal" and list(phases) == [
        "tests", "cost_curve", "bench", "serve", "vllm"]
    assert "passed" in phases["tests"]["figures"]["result"]
    assert phases["cost_curve"]["figures"]["relative"]
    assert set(phases["bench"]["figures"]) == {"apibank-l1", "bfcl-simple_python"}
    for table in phases["bench"]["figures"].values():
        assert set(table) == {"ar", "suffix", "toolspec"}
    assert set(phases["serve"]["figures"]) == {"deployed", "toolspec", "plain"}
    # The replica serves the rehearsal's model and engine where the script put them (a
    # ModelServer user_config naming the shipped model once reloaded that one instead).
    assert phases["serve"]["figures"]["deployed"] == {
        "id": "smollm2-135m", "root": "smollm2-135m", "engine": "toolspec", "dtype": "fp32",
        "device": "cpu", "speculative_method": None}
    assert phases["serve"]["figures"]["plain"]["1"]["mat"] == 1.0  # no speculation in plain
    assert phases["vllm"]["figures"]["vllm"]["1"]["completion_tokens_per_s"] > 0
    assert (out / "summary.md").read_text().startswith("# GPU check (cpu rehearsal")
    assert ray_processes() == set()
