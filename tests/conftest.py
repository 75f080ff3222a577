import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(params=["qwen2", "llama"])
def tiny_family(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="session")
def ray_serve():
    """One local Ray for the whole test session, Serve's HTTP proxy on a free port; yields
    the base URL. Replicas import this checkout (and the test fakes) through PYTHONPATH."""
    import socket

    import ray
    from ray import serve

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # The raylet gives its agents 30 s to start, too short on 2 loaded cores.
    os.environ.setdefault("RAY_agent_register_timeout_ms", "300000")
    # Workers push metrics to the node's exporter every 2 s (default 10 s): a test scrapes them.
    os.environ.setdefault("RAY_metrics_report_interval_ms", "2000")
    root = Path(__file__).parent.parent
    # The tests' folders too: a replica unpickles what a test module defines by its name.
    folders = sorted({str(path.parent) for path in (root / "tests").rglob("test_*.py")})
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(root), str(root / "tests"), *folders,
         *filter(None, [os.environ.get("PYTHONPATH")])])
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        serve.shutdown()
        ray.shutdown()


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Tests that start local Ray (the ``ray_serve`` fixture, or a cluster of their own) are
    marked ``ray``: ``make test-fast`` leaves them out with the ``real_model`` ones."""
    for item in items:
        if "ray_serve" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.ray)
