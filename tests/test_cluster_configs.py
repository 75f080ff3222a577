"""``cluster/``: the ray up config passes Ray's autoscaler schema; the KubeRay RayService embeds
exactly ``cluster/serve_config.gpu.yaml``, a valid Serve config of the same application."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.serve.schema import ServeDeploySchema

from deployments import AppConfig

ROOT = Path(__file__).parent.parent
CLUSTER = ROOT / "cluster"


def test_ray_up_config_passes_the_autoscaler_schema() -> None:
    config = yaml.safe_load((CLUSTER / "ray-cluster-gpu.yaml").read_text())
    validate_config(prepare_config(config))
    workers = config["available_node_types"]["gpu_worker"]
    assert workers["node_config"]["InstanceType"].startswith("g")
    assert "toolspec-library" in config["available_node_types"]["head"]["resources"]


def test_rayservice_embeds_the_gpu_serve_config_and_it_is_valid() -> None:
    manifest = yaml.safe_load((CLUSTER / "rayservice.yaml").read_text())
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayService")
    embedded = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    assert embedded == yaml.safe_load((CLUSTER / "serve_config.gpu.yaml").read_text())
    (application,) = ServeDeploySchema.model_validate(embedded).applications
    local = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]
    assert application.import_path == local["import_path"]
    AppConfig.model_validate(application.args)
    deployments = {d.name: d for d in application.deployments}
    assert set(deployments) == {d["name"] for d in local["deployments"]}
    assert deployments["ModelServer"].ray_actor_options.num_gpus == 1

    cluster = manifest["spec"]["rayClusterConfig"]
    (gpu_group,) = cluster["workerGroupSpecs"]
    limits = gpu_group["template"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert gpu_group["replicas"] >= deployments["ModelServer"].num_replicas
    # The library actor's custom resource exists on the head (KubeRay wants a quoted JSON).
    head_resources = json.loads(json.loads(cluster["headGroupSpec"]["rayStartParams"]["resources"]))
    assert set(deployments["CallLibraryService"].ray_actor_options.resources) <= set(head_resources)
