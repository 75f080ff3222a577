"""``serve_config.yaml`` is a valid Serve deploy config whose args and deployment names match
what the builder builds."""

from __future__ import annotations

import pytest
import yaml
from helpers import REPO
from pydantic import ValidationError
from ray.serve.schema import ServeDeploySchema

from deployments import AppConfig, app_builder
from deployments.routing.prefix_router import PREFIX_ROUTER

CONFIG = REPO / "serve_config.yaml"


def test_serve_config_validates_and_matches_the_builder() -> None:
    document = yaml.safe_load(CONFIG.read_text())
    schema = ServeDeploySchema.model_validate(document)
    (application,) = schema.applications
    assert application.import_path == "deployments:app_builder"
    config = AppConfig.model_validate(application.args)
    assert config.model.model == "qwen2.5-coder-0.5b"
    built = app_builder(application.args)
    names = {d.name for d in application.deployments}
    assert names == {"Ingress", "ModelServer", "CallLibraryService", "ResponseStore"}
    assert built._bound_deployment.name == "Ingress"
    model = next(d for d in application.deployments if d.name == "ModelServer")
    built_model = built._bound_deployment.init_args[0]._bound_deployment._deployment_config
    assert built_model.request_router_config.request_router_class == PREFIX_ROUTER
    # Replicas follow load; one scaled down finishes its requests (bounded by their deadline).
    assert config.model.replicas is None and built_model.autoscaling_config.max_replicas >= 2
    assert built_model.graceful_shutdown_timeout_s == config.request_timeout_s
    assert built_model.health_check_period_s == config.model.health_check_period_s == 10
    assert set(model.user_config) == {"model", "dtype", "draft_budget"}
    assert config.engine_settings().prepack_linear
    # Served trees are sized as the benchmarks' are (a fixed 7 replays 1.2-1.6x slower).
    assert config.model.draft_budget == model.user_config["draft_budget"] == "auto"
    assert AppConfig().engine_settings().draft_budget == "auto"


def test_unknown_args_are_rejected_at_deploy_time() -> None:
    with pytest.raises(ValidationError):
        AppConfig.model_validate({"model": {"modle": "typo"}})


def test_weight_packing_is_a_switch() -> None:
    stock = AppConfig.model_validate({"model": {"prepack_linear": False}})
    assert not stock.engine_settings().prepack_linear
    with pytest.raises(ValidationError, match="prepack_linear"):  # the old per-row-count knob
        AppConfig.model_validate({"model": {"prepack_linear": [8, 16]}})
    with pytest.raises(ValidationError, match="packed_rows"):
        AppConfig.model_validate({"model": {"packed_rows": [8, 16]}})


def test_fixed_replicas_and_autoscaling_exclude_each_other() -> None:
    with pytest.raises(ValidationError, match="not both"):
        AppConfig.model_validate({"model": {"replicas": 2, "autoscaling": {"max_replicas": 3}}})
    with pytest.raises(ValidationError):  # Ray's own check of the autoscaling config
        AppConfig.model_validate({"model": {"autoscaling": {"min_replicas": 3,
                                                            "max_replicas": 2}}})
    fixed = AppConfig.model_validate({"model": {"replicas": 3, "routing": "session_hash"}})
    options = fixed.model.replica_options()
    assert options["num_replicas"] == 3 and "autoscaling_config" not in options
    assert options["request_router_config"].request_router_class.endswith(
        "ConsistentHashRouter")
    assert "request_router_config" not in AppConfig.model_validate(
        {"model": {"routing": "power_of_two"}}).model.replica_options()
    with pytest.raises(ValidationError, match="step_rows"):
        AppConfig.model_validate({"model": {"step_rows": -1}})


def test_the_health_check_period_is_a_setting() -> None:
    """How soon a replica whose engine cannot serve is found (three failed checks in a row)."""
    quick = AppConfig.model_validate({"model": {"health_check_period_s": 2}})
    built = app_builder(quick.model_dump())
    model = built._bound_deployment.init_args[0]._bound_deployment._deployment_config
    assert model.health_check_period_s == 2
    with pytest.raises(ValidationError, match="health_check_period_s"):
        AppConfig.model_validate({"model": {"health_check_period_s": 0}})
