"""Autoscaling on a real local Ray: under load the model replicas go up, without
load back down, and no request is lost on the way — a replica scaled down finishes what it
holds (graceful drain). The engine is scripted (slow steps stand in for forwards)."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest
from ray import serve
from serve_fakes import fixed, scripted_factory

from deployments import AppConfig, LibraryConfig, ModelConfig, build_app

PIECES = tuple(f"word{i} " for i in range(20))  # 20 steps of 0.25 s: 5 s a request


def running_replicas(app: str) -> int:
    status = serve.status().applications[app].deployments["ModelServer"]
    return int(status.replica_states.get("RUNNING", 0))


def stream(base: str, index: int, results: list[Any]) -> None:
    payload = {"model": "qwen2.5-coder-0.5b", "stream": True, "max_tokens": 64,
               "messages": [{"role": "user", "content": f"Tell me about item {index}."}]}
    try:
        with httpx.stream("POST", f"{base}/v1/chat/completions", json=payload,
                          headers={"x-session-id": f"load-{index}"}, timeout=120) as response:
            body = response.read().decode()
        results.append((response.status_code, "[DONE]" in body and '"error"' not in body))
    except httpx.HTTPError as error:  # a lost request: counted, never raised in the thread
        results.append((599, repr(error)))


def wait_for(condition: Any, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen in {seconds} s"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def autoscaled_app(ray_serve: str) -> str:
    config = AppConfig(
        model=ModelConfig(num_cpus=0, autoscaling={
            "min_replicas": 1, "max_replicas": 2, "target_ongoing_requests": 1,
            "upscale_delay_s": 0, "downscale_delay_s": 2, "look_back_period_s": 2}),
        library=LibraryConfig(enabled=False), expose_replica=True)
    serve.run(build_app(config, scripted_factory(fixed(*PIECES), step_s=0.25)),
              name="autoscaled", route_prefix="/autoscaled")
    yield f"{ray_serve}/autoscaled"
    serve.delete("autoscaled")


def test_replicas_follow_load_up_and_down_and_no_request_is_lost(autoscaled_app: str) -> None:
    assert running_replicas("autoscaled") == 1
    results: list[Any] = []
    seen = {1}
    stop = threading.Event()

    def load() -> None:  # six clients, one request after another, until told to stop
        def client(number: int) -> None:
            index = number
            while not stop.is_set():
                stream(autoscaled_app, index, results)
                index += 6
        clients = [threading.Thread(target=client, args=(n,)) for n in range(6)]
        for thread in clients:
            thread.start()
        for thread in clients:
            thread.join()

    loader = threading.Thread(target=load)
    loader.start()
    try:
        def scaled_up() -> bool:
            seen.add(running_replicas("autoscaled"))
            return max(seen) == 2
        wait_for(scaled_up, 180, "scaling up to 2 replicas")
    finally:
        stop.set()  # requests in flight finish; then load drops to zero
        loader.join(timeout=300)
    # One request keeps running while the idle replicas scale down around it.
    tail: list[Any] = []
    last = threading.Thread(target=stream, args=(autoscaled_app, 999, tail))
    last.start()
    wait_for(lambda: running_replicas("autoscaled") == 1, 180, "scaling back down to 1")
    last.join(timeout=120)
    assert results and all(status == 200 and ok for status, ok in results), results
    assert tail == [(200, True)]
