"""One prepared command that proves and measures the GPU path, bounded by its own time limits.

On a CUDA machine (GPU time is rare and short: everything here is decided in advance):

1. **tests**: the test subset marked ``gpu`` (lossless greedy and seeded sampling, batched
   exactness, grammar masks on the logits' device, prefix-cache reuse), run on CUDA
   (``TOOLSPEC_TEST_DEVICE=cuda``);
2. **cost curve**: what verifying a tree of 1..256 rows costs against one row, on the GPU, bf16;
3. **bench**: ``toolspec bench`` with ``ar``, ``suffix``, ``toolspec`` in bf16 on a short slice
   of API-Bank level 1 and BFCL simple_python (items never tuned on), the e2e/decode table;
4. **serve**: the served system on the GPU (``num_gpus: 1``) and the concurrency load at 1, 8
   and 32 sessions for toolspec and plain decoding (``load_tests/concurrency.py``);
5. **vllm**: vLLM as the engine (``load_tests/peer_bench.py``): vLLM's server plain and with
   SuffixDecoding, and this deployment on vLLM's engine with the ToolSpec proposer, at 1, 8 and
   32 sessions (each engine started once, its prefix cache salted per level); it needs the
   ``vllm`` package (the CUDA build of the version ``pyproject.toml`` names) and Arctic
   Inference on the machine, and says so when they are missing;
6. everything under ``--out`` (each phase's JSON and output, ``summary.json``, ``summary.md``);
   Ray is stopped at the end whatever happened.

Each phase is a subprocess with a time limit; a phase that fails or runs out of time is
recorded and the next one runs. Without CUDA (or with ``--dry-run``) the same phases run as a
CPU rehearsal on small settings (SmolLM2-135M, fp32, a few items, a few seconds of load), so CI
tests the script itself where no GPU is.

    .venv/bin/python scripts/gpu_check.py --out results/gpu-check        # CUDA, ~8 minutes
    .venv/bin/python scripts/gpu_check.py --dry-run --out /tmp/gpu-dry    # anywhere
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).parents[1]
BIN = Path(sys.executable).parent
sys.path.insert(0, str(ROOT / "load_tests"))
from concurrency import mode_config  # noqa: E402


@dataclass(frozen=True)
class Settings:
    """What each phase runs with: the real check, or the CPU rehearsal."""

    model: str
    dtype: str
    max_k: int
    bench_items: int
    max_new_tokens: int
    levels: str
    load_seconds: float
    num_gpus: float
    limits_s: dict[str, float] = field(default_factory=dict)  # per phase
    # The vllm phase: which engines, at which levels, how long a level.
    vllm_engines: str = "vllm,vllm-suffix-k16,toolspec-vllm-k16"
    vllm_levels: str = "1,8,32"
    vllm_seconds: float = 12.0
    vllm_kv_cache_gib: float = 4.0  # on CPU (a GPU's comes from gpu_memory_utilization)
    # The serve phase's model settings over serve_config.yaml's (the rehearsal: no compile, a
    # small KV cache, so a 2-core CI machine starts vLLM's engine in seconds, not minutes).
    serve_model: dict[str, Any] = field(default_factory=dict)


# Under 9.5 minutes in all: the limits add up to 560 s.
CUDA = Settings("qwen2.5-coder-0.5b", "bf16", 256, 10, 128, "1,8,32", 15.0, 1.0,
                {"tests": 80, "cost_curve": 40, "bench": 100, "serve": 140, "vllm": 200})
# The rehearsal: one level, one vLLM engine, nothing compiled, a small KV cache (a 4 GiB one
# takes vLLM ~10 s to set up here): the plumbing, in CI time. Its serve phase runs the
# project's own engine (it switches modes in place; vLLM's would start twice more): vLLM
# behind the deployment is the vllm phase's, and the suite's.
REHEARSAL = Settings("smollm2-135m", "fp32", 8, 1, 16, "1", 3.0, 0.0,
                     {"tests": 300, "cost_curve": 120, "bench": 300, "serve": 420,
                      "vllm": 300}, "vllm", "1", 3.0, 0.5, {"engine": "toolspec"})


@dataclass
class Phase:
    name: str
    status: str = "not run"  # ok, failed, timeout
    seconds: float = 0.0
    figures: dict[str, Any] = field(default_factory=dict)
    output_tail: str = ""


def run_phase(phase: Phase, command: list[str], limit_s: float, out: Path,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str] | None:
    """Run ``command`` within ``limit_s``; its output goes to ``out/<phase>.log``.
    Mutates: ``phase``."""
    began = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=limit_s,
                              cwd=ROOT, env={**os.environ, **(env or {})})
    except subprocess.TimeoutExpired as expired:
        phase.status, phase.seconds = "timeout", round(time.monotonic() - began, 1)
        text = (expired.stdout or b"").decode() if isinstance(expired.stdout, bytes) \
            else expired.stdout or ""
        phase.output_tail = text[-2000:]
        return None
    phase.seconds = round(time.monotonic() - began, 1)
    phase.status = "ok" if done.returncode == 0 else "failed"
    (out / f"{phase.name}.log").write_text(done.stdout + "\n--- stderr ---\n" + done.stderr)
    phase.output_tail = (done.stdout + done.stderr)[-2000:]
    return done


def tests(settings: Settings, device: str, out: Path) -> Phase:
    phase = Phase("tests")
    done = run_phase(phase, [str(BIN / "python"), "-m", "pytest", "-q", "-m", "gpu",
                             "-p", "no:cacheprovider"], settings.limits_s["tests"], out,
                     {"TOOLSPEC_TEST_DEVICE": device})
    if done is not None:
        last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
        phase.figures = {"device": device, "result": last}
    return phase


def cost_curve(settings: Settings, out: Path) -> Phase:
    phase = Phase("cost_curve")
    folder = out / "cost-curve"
    done = run_phase(phase, [str(BIN / "toolspec"), "bench", "cost-curve", "--model",
                             settings.model, "--dtype", settings.dtype, "--max-k",
                             str(settings.max_k), "--repeats", "3", "--out", str(folder)],
                     settings.limits_s["cost_curve"], out)
    curve = folder / "cost_curve.json"
    if done is not None and curve.is_file():
        document = json.loads(curve.read_text())
        phase.figures = {key: document[key] for key in ("machine", "dtype", "seconds",
                                                         "relative") if key in document}
    return phase


def bench(settings: Settings, out: Path) -> Phase:
    phase = Phase("bench")
    began = time.monotonic()
    phase.status, phase.figures = _bench_sets(settings, out, phase)
    phase.seconds = round(time.monotonic() - began, 1)
    return phase


def _bench_sets(settings: Settings, out: Path, phase: Phase) -> tuple[str, dict[str, Any]]:
    """Both sets' e2e/decode tables; the status is the first set's failure, if any."""
    tables = {}
    for name, data, skip in (("apibank-l1", "apibank:level-1", 200),
                             ("bfcl-simple_python", "bfcl:simple_python", 100)):
        folder = out / "bench" / name
        done = run_phase(Phase(name), [
            str(BIN / "toolspec"), "bench", "--model", settings.model, "--dtype",
            settings.dtype, "--data", data, "--skip", str(skip), "--limit",
            str(settings.bench_items), "--methods", "ar,suffix,toolspec", "--max-new-tokens",
            str(settings.max_new_tokens), "--out", str(folder)],
            settings.limits_s["bench"] / 2, out)
        results = folder / "results.json"
        if done is None or done.returncode != 0 or not results.is_file():
            phase.output_tail = (done.stdout + done.stderr)[-2000:] if done else ""
            return ("failed" if done is not None else "timeout"), tables
        document = json.loads(results.read_text())
        tables[name] = {method: {key: figures.get(key) for key in
                                 ("e2e_speedup", "decode_speedup", "mat", "identical_to_ar")}
                        for method, figures in document["methods"].items()}
    return "ok", tables


def serve_config(settings: Settings, http_port: int) -> dict[str, Any]:
    """``serve_config.yaml`` serving ``settings.model`` on this machine's accelerator, already
    as the load's first mode (plain, one replica) deploys it, so the load's own deploy of that
    mode restarts nothing. The model, dtype and GPUs are set where the replica reads them: the
    builder's ``args.model`` and the ModelServer's ``user_config`` and ``ray_actor_options``
    (values under ``deployments:`` override the builder's, and a ``user_config`` naming
    another model would reload it)."""
    config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    config["http_options"]["port"] = http_port
    (application,) = config["applications"]
    application["args"]["served_model_name"] = settings.model
    loaded = {"model": settings.model, "dtype": settings.dtype}
    application["args"]["model"].update({**loaded, "num_gpus": settings.num_gpus,
                                         **settings.serve_model})
    (server,) = [d for d in application["deployments"] if d["name"] == "ModelServer"]
    server.setdefault("user_config", {}).update(loaded)
    server.setdefault("ray_actor_options", {})["num_gpus"] = settings.num_gpus
    return mode_config(config, draft_budget=0)


def serve(settings: Settings, out: Path) -> Phase:
    """The served system on this machine's accelerator, and the concurrency load (plain first,
    then toolspec, level by level): on a Ray of its own (its own ports and temp dir, stopped by
    its own processes), so no other Ray on the machine is touched."""
    phase = Phase("serve")
    ports = [free_port() for _ in range(3)]
    generated = out / "serve_config.yaml"
    generated.write_text(yaml.safe_dump(serve_config(settings, ports[2]), sort_keys=False))
    url = f"http://127.0.0.1:{ports[2]}"
    temp = Path(tempfile.mkdtemp(prefix="tsgpu-"))  # short: Ray's socket paths
    # Workers (the replicas, the engine's processes) at nice 0, as `make serve` starts them.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_worker_niceness": "0",
           "RAY_ADDRESS": f"127.0.0.1:{ports[0]}",
           "RAY_DASHBOARD_ADDRESS": f"http://127.0.0.1:{ports[1]}",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get(
               "PYTHONPATH")]))}
    limit = settings.limits_s["serve"]
    began = time.monotonic()
    try:
        subprocess.run([str(BIN / "ray"), "start", "--head", f"--port={ports[0]}",
                        f"--dashboard-port={ports[1]}", f"--temp-dir={temp}",
                        "--disable-usage-stats"], check=True, capture_output=True,
                       timeout=180, env=env)
        subprocess.run([str(BIN / "serve"), "deploy", str(generated)], check=True,
                       capture_output=True, timeout=180, env=env)
        left = max(30.0, limit - (time.monotonic() - began))
        done = run_phase(phase, [
            str(BIN / "python"), "load_tests/concurrency.py", "--model", settings.model,
            "--url", url, "--config", str(generated), "--levels", settings.levels,
            "--modes", "plain,toolspec", "--seconds", str(settings.load_seconds),
            "--max-tokens", str(settings.max_new_tokens), "--warmup", "2",
            "--bfcl", "simple_python:4", "--out", str(out / "concurrency")], left, out, env)
        report = out / "concurrency" / "results.json"
        if done is not None and report.is_file():
            phase.figures = {"deployed": deployed(url),
                             **json.loads(report.read_text()).get("levels", {})}
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as error:
        detail = getattr(error, "stderr", b"") or b""
        phase.status = "failed"
        phase.output_tail = (str(error) + "\n" + (detail.decode() if isinstance(
            detail, bytes) else detail))[-2000:]
    finally:  # never leave a process running
        subprocess.run([str(BIN / "serve"), "shutdown", "--yes"], capture_output=True,
                       timeout=120, env=env)
        stop_processes_under(temp)
    phase.seconds = round(time.monotonic() - began, 1)
    return phase


def deployed(url: str) -> dict[str, Any]:
    """What the deployment says it serves (``/v1/models``: engine, model, dtype, device), or
    why it could not be read (the phase's figures are kept either way)."""
    try:
        with urllib.request.urlopen(f"{url}/v1/models", timeout=30) as answer:
            (model,) = json.loads(answer.read())["data"]
    except (OSError, ValueError) as error:  # urllib's URLError is an OSError
        return {"error": f"/v1/models: {error}"}
    return {key: model.get(key) for key in ("id", "root", "engine", "dtype", "device",
                                             "speculative_method")}


def vllm(settings: Settings, cuda: bool, out: Path) -> Phase:
    """vLLM's server plain and with SuffixDecoding, and this deployment on vLLM's engine with
    the ToolSpec proposer, side by side (``load_tests/peer_bench.py``)."""
    phase = Phase("vllm")
    try:
        import vllm as _vllm  # noqa: F401 - only whether it is installed
    except ImportError as error:
        phase.status, phase.output_tail = "failed", f"vllm is not installed here: {error}"
        return phase
    folder = out / "peer"
    done = run_phase(phase, [
        str(BIN / "python"), "load_tests/peer_bench.py", "--model", settings.model,
        "--engines", settings.vllm_engines, "--levels", settings.vllm_levels, "--seconds",
        str(settings.vllm_seconds), "--warmup", "1", "--max-tokens",
        str(settings.max_new_tokens), "--kv-cache-gib", str(settings.vllm_kv_cache_gib),
        "--one-start", *(["--gpu"] if cuda else ["--eager"]),
        "--out", str(folder)], settings.limits_s["vllm"], out)
    report = folder / "results.json"
    if done is not None and report.is_file():
        engines = json.loads(report.read_text())["engines"]
        phase.figures = {name: {level: {key: figures.get(key) for key in (
            "completion_tokens_per_s", "ttft_p50_s", "ttft_p99_s", "inter_token_p50_s", "mat")}
            for level, figures in by_level.items()} for name, by_level in engines.items()}
    return phase


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def stop_processes_under(temp: Path) -> None:
    """Stop the Ray started with ``--temp-dir temp``: its processes name that directory
    (``ray stop`` would stop every Ray on the machine)."""
    mine = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if str(temp) in (entry / "cmdline").read_bytes().decode(errors="ignore"):
                    mine.append(int(entry.name))
            except OSError:
                continue
    for pid in mine:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    time.sleep(2)
    for pid in mine:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def markdown(summary: dict[str, Any]) -> str:
    lines = [f"# GPU check ({summary['mode']}, {summary['device']})", "",
             f"{summary['started']}; model {summary['settings']['model']} "
             f"{summary['settings']['dtype']}; command `{summary['command']}`", "",
             "| phase | status | seconds |", "|---|---|---:|"]
    lines += [f"| {p['name']} | {p['status']} | {p['seconds']} |" for p in summary["phases"]]
    for phase in summary["phases"]:
        if phase["figures"]:
            lines += ["", f"## {phase['name']}", "", "```json",
                      json.dumps(phase["figures"], indent=1)[:4000], "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "gpu-check")
    parser.add_argument("--dry-run", action="store_true",
                        help="the CPU rehearsal even where CUDA is (small model and settings)")
    parser.add_argument("--phases", default="tests,cost_curve,bench,serve,vllm")
    args = parser.parse_args()
    import torch

    cuda = torch.cuda.is_available() and not args.dry_run
    settings = CUDA if cuda else REHEARSAL
    device = f"cuda ({torch.cuda.get_device_name(0)})" if cuda else "cpu"
    args.out.mkdir(parents=True, exist_ok=True)
    chosen = args.phases.split(",")
    phases = []
    runners = {"tests": lambda: tests(settings, "cuda" if cuda else "cpu", args.out),
               "cost_curve": lambda: cost_curve(settings, args.out),
               "bench": lambda: bench(settings, args.out),
               "serve": lambda: serve(settings, args.out),
               "vllm": lambda: vllm(settings, cuda, args.out)}
    for name in chosen:
        phase = runners[name]()
        phases.append(phase)
        print(f"{name}: {phase.status} in {phase.seconds} s", flush=True)
    summary = {"mode": "cuda" if cuda else "cpu rehearsal", "device": device,
               "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
               "command": " ".join(["scripts/gpu_check.py", *sys.argv[1:]]),
               "settings": asdict(settings), "phases": [asdict(p) for p in phases]}
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2))
    (args.out / "summary.md").write_text(markdown(summary))
    print(markdown(summary))
    return 0 if all(p.status == "ok" for p in phases) else 1


if __name__ == "__main__":
    sys.exit(main())
