"""The house's floors: a package imports only packages on lower floors (or its own), and nothing
that serves imports what only measures. Read from the source with ``ast`` (no imports run), so
a new arrow pointing the wrong way fails here before it spreads."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]

# Floor of each part of the house; an import may point to the same floor only inside one part.
FLOORS: dict[str, int] = {
    "toolspec.calls": 0,      # tool sets, call formats, the output parse, prompts, grammars
    "toolspec.library": 1,    # the sharded LMDB call library (its calls are calls.ToolCall)
    "toolspec.core": 1,       # the decode loop and the interfaces it calls
    "toolspec.model": 2,      # weights, kernels, the forward (implements core.forward)
    "toolspec.drafting": 2,   # draft sources (implement core.drafter)
    "toolspec.registry": 3,   # a method name -> drafters + budget, for bench and serving
    "toolspec.vllm": 4,       # the drafter as a vLLM speculative method (its proposer)
    # Serving (never imports measuring code), in parts named for the processes that run them.
    "deployments.messages": 5,           # what travels between the ingress and a replica
    "deployments.ops": 5,                # metrics, tracing, deployment names, readiness
    "deployments.library": 6,            # retrieval actors; a replica's library view
    "deployments.stored_responses": 6,   # the Responses API's store and its deployment
    "deployments.http": 7,               # the ingress process: the OpenAI API
    "deployments.replica": 7,            # a model replica's process: its engine
    "deployments.routing": 7,            # picking a replica (in the caller's process)
    "deployments.app": 8,                # config and build_app: the only part seeing all
    "toolspec.bench": 5,      # measuring: may import anything below it
}


def _part(module: str) -> str | None:
    matches = [part for part in FLOORS if module == part or module.startswith(part + ".")]
    return max(matches, key=len) if matches else None


def _modules() -> dict[str, Path]:
    files = [*ROOT.joinpath("toolspec").rglob("*.py"), *ROOT.joinpath("deployments").rglob("*.py")]
    modules = {}
    for path in files:
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        modules[name.removesuffix(".__init__")] = path
    return modules


def _imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


MODULES = _modules()


def test_every_module_lives_in_a_part_of_the_house() -> None:
    homeless = sorted(name for name in MODULES
                      if _part(name) is None and name not in ("toolspec", "deployments"))
    assert homeless == [], f"modules outside every part in FLOORS: {homeless}"


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down_or_within_the_same_part(module: str) -> None:
    part = _part(module)
    if part is None:  # the package's own __init__: lazy names only
        return
    wrong = []
    for target in _imports(MODULES[module]):
        target_part = _part(target) if target in MODULES else None
        if target_part is None or target_part == part:
            continue
        if FLOORS[target_part] >= FLOORS[part]:
            wrong.append(f"{target} (floor {FLOORS[target_part]})")
    assert not wrong, f"{module} (floor {FLOORS[part]}) imports upward or sideways: {wrong}"


def test_nothing_outside_bench_imports_measuring_code() -> None:
    outside = [*ROOT.joinpath("deployments").rglob("*.py"),
               *(path for path in ROOT.joinpath("toolspec").rglob("*.py")
                 if "bench" not in path.relative_to(ROOT).parts)]
    offenders = {str(path.relative_to(ROOT)): sorted(
        target for target in _imports(path) if target.startswith("toolspec.bench"))
        for path in outside}
    assert {path: found for path, found in offenders.items() if found} == {}


def test_a_replica_process_never_loads_the_http_layer() -> None:
    """The replica, its engines and scheduler import plain message types, never the ingress's
    admission, pydantic schemas or routes, nor the app builder (run in a fresh interpreter:
    nothing preloaded)."""
    replica = [name for name in MODULES if _part(name) == "deployments.replica"]
    code = (f"import sys, {', '.join(n for n in replica if not n.endswith('vllm_engine'))}; "
            "print(sorted(m for m in sys.modules if m.startswith(('deployments.http', "
            "'deployments.app', 'toolspec.bench'))))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=120, check=True)
    assert done.stdout.strip() == "[]"


def _module_edges(path: Path) -> set[str]:
    """The house's modules ``path`` imports; ``from package import submodule`` is an edge to
    the submodule alone (the package is being imported already when its parts do that)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            submodules = {f"{node.module}.{alias.name}" for alias in node.names} & MODULES.keys()
            found |= submodules
            if len(submodules) < len(node.names) and node.module in MODULES:
                found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in MODULES)
    return found


def _cycle() -> list[str]:
    """One import cycle among the house's modules (type-only imports count: a cycle there
    still means neither module can be read alone), or [] when there is none."""
    graph = {name: sorted(target for target in _module_edges(path) if target != name)
             for name, path in MODULES.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> list[str]:
        state[name] = 1
        for target in graph[name]:
            if state.get(target) == 1:
                return [*path[path.index(target):], target] if target in path else [name, target]
            if target not in state:
                found = visit(target, [*path, target])
                if found:
                    return found
        state[name] = 2
        return []

    for name in sorted(graph):
        if name not in state:
            found = visit(name, [name])
            if found:
                return found
    return []


def test_no_module_imports_itself_through_others() -> None:
    assert _cycle() == []


def test_the_http_side_and_the_replica_side_never_import_each_other() -> None:
    """Both on one floor, so the floor rule forbids it; said here by name, as the design is."""
    for module, path in MODULES.items():
        part = _part(module)
        other = {"deployments.http": "deployments.replica",
                 "deployments.replica": "deployments.http"}.get(part or "")
        if other:
            crossing = sorted(t for t in _imports(path) if t.startswith(other))
            assert crossing == [], f"{module} imports {crossing}"


def test_the_tests_mirror_the_source() -> None:
    """Each folder of tests is named for what it tests: a part of ``toolspec`` (``tests/core``
    for ``toolspec/core``), of the serving side (``tests/serving/http`` for
    ``deployments/http``), or the scripts; only house-wide tests sit at the top."""
    tests = ROOT / "tests"
    places = {path.parent.relative_to(tests) for path in tests.rglob("test_*.py")}
    misplaced = []
    for place in sorted(places, key=str):
        parts = place.parts
        if not parts:
            continue
        if parts[0] == "serving":
            source = ROOT.joinpath("deployments", *parts[1:])
        elif parts[0] == "scripts":
            source = ROOT / "scripts"
        else:
            source = ROOT.joinpath("toolspec", *parts)
        if not source.is_dir():
            misplaced.append(str(place))
    assert misplaced == [], f"test folders that mirror no part of the source: {misplaced}"
