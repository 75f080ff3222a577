"""``cluster/``: the ray up config passes Ray's autoscaler schema; the KubeRay RayService embeds
exactly ``cluster/serve_config.gpu.yaml``, a valid Serve config of the same application."""

from __future__ import annotations

import json
import re

import yaml
from helpers import REPO
from ray.autoscaler._private.util import prepare_config, validate_config
from ray.serve.schema import ServeDeploySchema
from ray.util.metrics import Metric

from deployments import AppConfig
from deployments.ops import metrics

CLUSTER = REPO / "cluster"


def test_ray_up_config_passes_the_autoscaler_schema() -> None:
    config = yaml.safe_load((CLUSTER / "ray-cluster-gpu.yaml").read_text())
    validate_config(prepare_config(config))
    workers = config["available_node_types"]["gpu_worker"]
    assert workers["node_config"]["InstanceType"].startswith("g")
    assert {"toolspec-library", "toolspec-responses"} <= \
        set(config["available_node_types"]["head"]["resources"])


def test_rayservice_embeds_the_gpu_serve_config_and_it_is_valid() -> None:
    documents = list(yaml.safe_load_all((CLUSTER / "rayservice.yaml").read_text()))
    manifest = documents[0]
    claim = documents[1]
    assert claim["kind"] == "PersistentVolumeClaim"
    head = manifest["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in head["volumes"]}
    assert volumes["library"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert manifest["spec"]["rayClusterConfig"]["authOptions"] == {"mode": "token"}
    assert (manifest["apiVersion"], manifest["kind"]) == ("ray.io/v1", "RayService")
    embedded = yaml.safe_load(manifest["spec"]["serveConfigV2"])
    assert embedded == yaml.safe_load((CLUSTER / "serve_config.gpu.yaml").read_text())
    (application,) = ServeDeploySchema.model_validate(embedded).applications
    local = yaml.safe_load((REPO / "serve_config.yaml").read_text())["applications"][0]
    assert application.import_path == local["import_path"]
    AppConfig.model_validate(application.args)
    deployments = {d.name: d for d in application.deployments}
    assert set(deployments) == {d["name"] for d in local["deployments"]}
    model = AppConfig.model_validate(application.args).model
    assert deployments["ModelServer"].ray_actor_options.num_gpus == model.num_gpus == 1
    assert model.tensor_parallel_size == 2
    assert model.placement()["placement_group_bundles"] == [{"CPU": 2, "GPU": 1}] * 2

    cluster = manifest["spec"]["rayClusterConfig"]
    (gpu_group,) = cluster["workerGroupSpecs"]
    limits = gpu_group["template"]["spec"]["containers"][0]["resources"]["limits"]
    # A replica's ranks all sit on one node (STRICT_PACK): a pod holds all of them.
    assert int(limits["nvidia.com/gpu"]) == model.tensor_parallel_size
    assert gpu_group["maxReplicas"] >= model.autoscaling["max_replicas"]
    assert gpu_group["replicas"] >= model.autoscaling["min_replicas"]
    # The library actor's custom resource exists on the head (KubeRay wants a quoted JSON).
    head_resources = json.loads(json.loads(cluster["headGroupSpec"]["rayStartParams"]["resources"]))
    library = AppConfig.model_validate(application.args).library
    assert library.resources and set(library.resources) <= set(head_resources)
    # Two ingress replicas share one store of responses: its actor's, on the head, by its
    # volume (a file per ingress node would answer the other ingress's ids with 404s).
    assert deployments["Ingress"].num_replicas == 2
    assert deployments["ResponseStore"].num_replicas == 1
    responses = AppConfig.model_validate(application.args).responses
    assert responses.resources and set(responses.resources) <= set(head_resources)
    mounts = {mount["mountPath"]: mount["name"]
              for mount in head["containers"][0]["volumeMounts"]}
    claims = {document["metadata"]["name"] for document in documents[1:]}
    assert volumes[mounts[responses.path]]["persistentVolumeClaim"]["claimName"] in claims


def test_the_grafana_dashboard_shows_every_metric_the_deployment_exports() -> None:
    exported = {value._name for value in vars(metrics).values() if isinstance(value, Metric)}
    dashboard = json.loads((CLUSTER / "grafana-toolspec.json").read_text())
    queried = set()
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            for name in re.findall(r"ray_(toolspec_\w+)", target["expr"]):
                queried.add(re.sub(r"_(total|bucket|sum|count)$", "", name))
    assert queried == exported
