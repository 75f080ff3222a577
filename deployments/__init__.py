"""Ray Serve deployments of ToolSpec: OpenAI-compatible ingress, model replicas, call library.

``build_app(AppConfig(...))`` gives the bound application; ``app_builder`` is the entry point
``serve_config.yaml`` names.
"""

from deployments.builder import AppConfig, LibraryConfig, ModelConfig, app_builder, build_app

__all__ = ["AppConfig", "LibraryConfig", "ModelConfig", "app_builder", "build_app"]
