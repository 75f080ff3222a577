"""The deployment on a multi-node Ray cluster (Ray's own ``cluster_utils``: a head and two worker
raylets on this machine), driven by ``load_tests/cluster_faults.py`` in a process of its own
(its own cluster, apart from the session's one-node Ray): placement by the config's resources,
HTTP end to end across nodes, a replica's node lost under load, the library's node lost with
every committed call kept (a scripted engine, no model: what is tested is the serving system's
placement and fault handling), and a two-rank replica of the default model placed on one node,
rebuilt when its worker rank is killed and replaced as one group when that node is lost.
Bounded to about four minutes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from helpers import REPO

pytestmark = [pytest.mark.ray, pytest.mark.real_model]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("cluster")
    done = subprocess.run(
        [sys.executable, str(REPO / "load_tests" / "cluster_faults.py"), "--out", str(out),
         "--clients", "4", "--seconds", "10", "--warmup-requests", "8",
         "--recovery-timeout-s", "150", "--timeout-s", "45", "--tensor-parallel"],
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads((out / "results.json").read_text())


def test_each_part_runs_where_the_config_places_it(report: dict) -> None:
    placed = report["placement"]
    assert placed["ProxyActor"] == ["head"] and placed["Ingress"] == ["head"]
    assert placed["ModelServer"] == ["worker-1", "worker-2"]  # spread: one per worker
    assert placed["CallLibraryService"] == ["worker-2"]
    assert placed["ResponseStore"] == ["head"]  # the stored responses' one owner


def test_a_call_through_the_heads_proxy_is_answered_on_workers_and_reaches_the_library(
        report: dict) -> None:
    across = report["across_nodes"]
    assert across["failed"] == 0 and across["replicas_answering"] == 2
    assert across["calls_reached_library_s"] is not None and across["library_calls"] >= 8


def test_losing_a_replicas_node_fails_no_plain_request_and_hangs_no_stream(report: dict) -> None:
    lost = report["replica_node_lost"]
    assert lost["plain"].get("ok", 0) > 0 and set(lost["plain"]) == {"ok"}, lost
    assert lost["stream"].get("hung", 0) == 0 and lost["stream"].get("ok", 0) > 0, lost
    assert lost["full_capacity_after_node_added_s"] is not None, lost
    assert lost["placement_after"]["ModelServer"] == ["worker-2", "worker-3"]


def test_losing_the_librarys_node_keeps_every_committed_call(report: dict) -> None:
    lost = report["library_node_lost"]
    assert lost["calls_lost"] == 0 and lost["calls_after"] >= lost["calls_before"] > 0, lost
    assert lost["library_back_after_node_added_s"] is not None
    assert lost["placement_after"]["CallLibraryService"] == ["worker-4"]
    assert lost["full_capacity_after_node_added_s"] is not None
    assert lost["placement_after"]["ModelServer"] == ["worker-3", "worker-4"]
    assert lost["stream"].get("hung", 0) == 0 and lost["plain"].get("ok", 0) > 0, lost


def test_a_two_rank_replica_is_placed_and_replaced_as_one_group(report: dict) -> None:
    """Both ranks on the one ``toolspec-tp`` node; a killed worker rank fails the replica's
    health check and Serve builds a new group there; that node lost, the whole group comes back
    on the next one. Every answer is the call the whole model makes (get_weather, Oslo)."""
    split = report["tensor_parallel"]
    assert split["answered_before"], split
    assert split["ranks_before"] == ["worker-5", "worker-5"]  # STRICT_PACK: one node
    assert split["answered_after_rank_killed_s"] is not None, split
    assert split["ranks_after_rank_killed"] == ["worker-5", "worker-5"]
    assert split["ranks_after"] == ["worker-6", "worker-6"]  # the whole group, elsewhere
    assert split["answered_after_node_added_s"] is not None
    assert split["calls"] == [["get_weather", {"city": "Oslo"}]] * 3, split
