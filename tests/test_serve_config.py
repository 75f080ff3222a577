"""``serve_config.yaml`` is a valid Serve deploy config whose args and deployment names match
what the builder builds."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError
from ray.serve.schema import ServeDeploySchema

from deployments import AppConfig, app_builder
from deployments.builder import SESSION_ROUTER

CONFIG = Path(__file__).parent.parent / "serve_config.yaml"


def test_serve_config_validates_and_matches_the_builder() -> None:
    document = yaml.safe_load(CONFIG.read_text())
    schema = ServeDeploySchema.model_validate(document)
    (application,) = schema.applications
    assert application.import_path == "deployments:app_builder"
    config = AppConfig.model_validate(application.args)
    assert config.model.model == "qwen2.5-coder-0.5b"
    built = app_builder(application.args)
    names = {d.name for d in application.deployments}
    assert names == {"Ingress", "ModelServer", "CallLibraryService"}
    assert built._bound_deployment.name == "Ingress"
    model = next(d for d in application.deployments if d.name == "ModelServer")
    assert model.request_router_config["request_router_class"] == SESSION_ROUTER
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
