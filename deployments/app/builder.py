"""``build_app``: a pydantic ``AppConfig`` becomes the bound Serve deployments.

    Ingress (FastAPI, OpenAI API)  --prompt blocks, session-->  ModelServer replicas
                                                          (prefix-aware router, autoscaled)
    |  stored responses                                   |  prefetch / add calls
    v                                                     v
  ResponseStore (one actor, LMDB)                   CallLibraryService (one actor, LMDB)

``serve_config.yaml`` points at ``deployments:app_builder`` with ``args`` (this config); its
per-deployment entries (replicas, actor options, ``user_config``...) override the defaults set
here. The deployments' names are ``deployments.ops.names``'s (``/health`` reads Serve's status by
them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from ray import serve
from ray.serve import Application
from ray.serve.config import AutoscalingConfig, BackpressureConfig, RequestRouterConfig

from deployments.http.admission import AdmissionPolicy
from deployments.http.auth import ApiKeySource
from deployments.http.ingress import Ingress
from deployments.http.limits import AdmissionLimits
from deployments.http.tenants import TENANT_HEADER, TENANT_PATTERN, TenantPolicy
from deployments.library.service import LibraryService
from deployments.ops.names import MODEL_DEPLOYMENT, RESPONSES_DEPLOYMENT, library_deployment_name
from deployments.replica.engine import EngineSettings
from deployments.replica.model_replica import EngineFactory, ModelServer
from deployments.routing.prefix_router import PREFIX_ROUTER
from deployments.stored_responses.service import ResponseService
from toolspec.model.tensor_parallel import check_divides

SESSION_ROUTER = "ray.serve.experimental.consistent_hash_router:ConsistentHashRouter"
# How requests reach the model replicas: prefix-aware (``deployments.routing.prefix_router``),
# a hash ring on the session id (Ray's ConsistentHashRouter), or Ray's default (power of two
# choices).
ROUTERS = {"prefix_aware": PREFIX_ROUTER, "session_hash": SESSION_ROUTER, "power_of_two": None}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelConfig(EngineSettings):
    """The model replicas: what each loads (``EngineSettings``, defined there once) and how
    Serve deploys them."""

    replicas: int | None = Field(
        None, ge=1, description="a fixed number of replicas (default 1); leave unset with "
                                "autoscaling")
    autoscaling: dict[str, Any] | None = Field(
        None, description="Ray Serve's autoscaling_config for the model replicas (min_replicas, "
                          "max_replicas, target_ongoing_requests, upscale_delay_s, "
                          "downscale_delay_s, ...): replicas follow load; a replica scaled "
                          "down finishes its requests first (graceful_shutdown_timeout_s)")
    routing: Literal["prefix_aware", "session_hash", "power_of_two"] = Field(
        "prefix_aware", description="prefix_aware: a session's replica, else the one holding "
                                    "the longest start of the prompt, else the prompt's "
                                    "rendezvous-hash home, skipping long queues; session_hash: "
                                    "Ray's ConsistentHashRouter on the session id; "
                                    "power_of_two: Ray's default")
    imbalanced_threshold: int = Field(
        4, ge=0, description="prefix_aware: queued requests a replica may have beyond the "
                             "shortest queue and still be chosen for what it holds")
    match_rate_threshold: float = Field(
        0.5, ge=0, le=1, description="prefix_aware: the share of a prompt's blocks a replica "
                                     "must be known to hold to be chosen for them")
    tensor_parallel_size: int = Field(
        1, ge=1, le=64, description="ranks per replica, each holding a part of every layer "
                                    "(must divide the model's key/value heads); each rank gets "
                                    "num_cpus and num_gpus, all on one node")
    num_cpus: float = Field(1.0, ge=0, description="per rank")
    num_gpus: float = Field(0.0, ge=0, description="per rank")
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources per rank (e.g. {model-node: 1} "
                                          "that only the nodes meant for model replicas have)")
    max_replicas_per_node: int | None = Field(
        None, ge=1, description="at most this many model replicas on one node (1: spread one "
                                "per node, so losing a node loses one replica)")
    max_ongoing_requests: int = Field(16, ge=1)
    max_queued_requests: int = Field(
        64, ge=1, description="requests waiting for a replica slot (per ingress replica); "
                              "past it the client gets 429 with Retry-After")
    retry_after_s: int = Field(2, ge=1, description="the Retry-After a queue-full 429 sends")
    health_check_period_s: float = Field(
        10.0, gt=0, description="how often Serve asks each model replica whether its engine "
                                "can still serve (a lost rank, a dead vLLM process); after "
                                "three failed checks in a row Serve replaces the replica")

    @model_validator(mode="after")
    def _replicas_or_autoscaling(self) -> ModelConfig:
        if self.autoscaling is not None:
            if self.replicas is not None:
                raise ValueError("set model.replicas (a fixed count) or model.autoscaling, "
                                 "not both")
            AutoscalingConfig.model_validate(self.autoscaling)  # Ray's own checks, at deploy
        return self

    def replica_options(self) -> dict[str, Any]:
        """``num_replicas`` or ``autoscaling_config``, and the request router."""
        options: dict[str, Any] = {"num_replicas": self.replicas or 1}
        if self.autoscaling is not None:
            options = {"num_replicas": "auto", "autoscaling_config": self.autoscaling}
        router = ROUTERS[self.routing]
        if router is not None:
            kwargs = {"imbalanced_threshold": self.imbalanced_threshold,
                      "match_rate_threshold": self.match_rate_threshold} \
                if self.routing == "prefix_aware" else {}
            options["request_router_config"] = RequestRouterConfig(
                request_router_class=router, request_router_kwargs=kwargs)
        return options

    @model_validator(mode="after")
    def _ranks_fit(self) -> ModelConfig:
        if self.tensor_parallel_size > 1:
            if self.num_cpus <= 0 and self.num_gpus <= 0:
                raise ValueError("tensor_parallel_size > 1 needs num_cpus or num_gpus per rank "
                                 "(each rank reserves a bundle of them)")
            heads = _model_heads(self.model)
            if heads is not None:
                check_divides(heads, self.tensor_parallel_size)
        return self

    def placement(self) -> dict[str, Any]:
        """Serve's per-replica placement group options: one bundle per rank, one node."""
        if self.tensor_parallel_size == 1:
            return {}
        bundle = {"CPU": self.num_cpus, **({"GPU": self.num_gpus} if self.num_gpus else {}),
                  **self.resources}
        return {"placement_group_bundles": [bundle] * self.tensor_parallel_size,
                "placement_group_strategy": "STRICT_PACK"}

    def actor_options(self) -> dict[str, Any]:
        """``ray_actor_options`` of a replica (rank 0's share when split)."""
        options: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.resources:
            options["resources"] = dict(self.resources)
        return options


def _model_heads(model: str) -> Any:
    """The model's config where it can be read without loading anything (a local directory,
    or a registered model already converted), else None: then the replica checks at load."""
    from transformers import AutoConfig

    from toolspec.model.packages import UnknownModelError, resolve_model_dir

    try:
        source = resolve_model_dir(model)
    except UnknownModelError:
        return None
    if isinstance(source, str) or not (Path(source) / "config.json").is_file():
        return None
    return AutoConfig.from_pretrained(source)


class LibraryConfig(_Strict):
    enabled: bool = True
    path: str | None = Field(None, description="default: $TOOLSPEC_HOME/serve-library")
    shards: int | None = None
    actors: int = Field(1, ge=1, le=256, description="retrieval actors, each owning the shards "
                                                     "s % actors == its index (deployments "
                                                     "CallLibraryService-<i> when more than one)")
    max_calls: int | None = 100_000
    seed_file: str | None = Field(None, description="calls to import into an empty library")
    num_cpus: float = Field(0.5, ge=0)
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources of each retrieval actor (pin it "
                                          "to nodes that reach `path`: a volume the next node "
                                          "mounts too, so the actor restarts with its calls)")
    # Replicas call it in the background and stop asking for a while when it refuses or
    # times out: a bounded queue keeps a slow library from piling up work.
    max_ongoing_requests: int = Field(32, ge=1)
    max_queued_requests: int = Field(256, ge=1)


class ResponsesConfig(_Strict):
    """Where ``POST /v1/responses`` keeps ``store: true`` responses (for ``previous_response_id``
    and ``GET /v1/responses/{id}``): an LMDB file owned by one actor (the ``ResponseStore``
    deployment) that every ingress replica calls; on a cluster, pin it (``resources``) to the
    node whose disk holds ``path`` (a persistent volume: the responses outlive the node)."""

    enabled: bool = True
    path: str | None = Field(None, description="default: $TOOLSPEC_HOME/responses on the "
                                               "actor's node")
    max_age_s: float = Field(30 * 86400, gt=0, description="a stored response older than "
                                                           "this is gone")
    max_responses: int = Field(100_000, ge=1, description="past this many, the oldest go")
    max_bytes: int = Field(1 << 30, ge=1 << 20, description="the store's file size at most; "
                                                            "full, the oldest go; one "
                                                            "response takes a quarter at most")
    num_cpus: float = Field(0.1, ge=0)
    resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources of the store's actor (pin it "
                                          "to the node whose disk holds `path`)")


class AppConfig(_Strict):
    served_model_name: str | None = Field(None, description="the model id clients send")
    model: ModelConfig = ModelConfig()
    library: LibraryConfig = LibraryConfig()
    default_max_tokens: int = Field(256, ge=1)
    max_tokens_limit: int = Field(2048, ge=1)
    tenant: str = Field("default", pattern=TENANT_PATTERN,
                        description="the tenant of requests that do not name one")
    tenant_header: str | None = Field(TENANT_HEADER, min_length=1,
                                      description="the header naming a request's tenant; "
                                                  "null: requests cannot name one")
    tenant_from_user: bool = Field(False, description="without the header, the body's `user` "
                                                      "names the tenant")
    limits: AdmissionLimits = AdmissionLimits()
    request_timeout_s: float | None = Field(
        300.0, gt=0, description="a request still running after this long is ended with a "
                                 "504 error object (streams: an error event); null: no limit")
    count_prompt_tokens_at_ingress: bool = Field(
        True, description="the ingress renders each prompt with the model's tokenizer and "
                          "refuses one past the context before any model work")
    expose_replica: bool = Field(False, description="responses name the replica that served "
                                                    "them (debugging session pinning)")
    api_keys_file: str | None = Field(
        None, description="a file of '<key or sha256:digest> <tenant>' lines on the ingress's "
                          "nodes (a mounted secret): /v1/* then needs a bearer key, whose "
                          "tenant it serves; never put keys in this config")
    api_keys_env: str | None = Field(
        None, description="the environment variable of the ingress's processes holding such "
                          "lines (newline- or comma-separated)")
    responses: ResponsesConfig = ResponsesConfig()
    ingress_replicas: int = Field(1, ge=1)
    ingress_resources: dict[str, float] = Field(
        default_factory=dict, description="custom Ray resources of each ingress replica (e.g. "
                                          "keep it on the head, beside the HTTP proxy)")
    ingress_max_ongoing_requests: int = Field(256, ge=1)

    def engine_settings(self) -> EngineSettings:
        return EngineSettings.model_validate(self.model.fields())

    def policy(self) -> AdmissionPolicy:
        tenants = TenantPolicy(self.tenant, self.tenant_header and self.tenant_header.lower(),
                               self.tenant_from_user)
        return AdmissionPolicy((self.served_model_name or self.model.model,),
                               self.default_max_tokens, self.max_tokens_limit, tenants,
                               self.limits, self.request_timeout_s,
                               self.expose_replica)


def build_app(config: AppConfig, engine_factory: EngineFactory | None = None) -> Application:
    """The application ``serve.run`` / ``serve deploy`` runs. ``engine_factory`` replaces the
    real engine (tests)."""
    library = None
    if config.library.enabled:
        library = [library_part(config.library, index)
                   for index in range(config.library.actors)]
    settings = config.engine_settings()
    model_options: dict[str, Any] = {
        "name": MODEL_DEPLOYMENT,
        **config.model.replica_options(),
        "max_ongoing_requests": config.model.max_ongoing_requests,
        "max_queued_requests": config.model.max_queued_requests,
        "backpressure_config": BackpressureConfig(status_code=429,
                                                  retry_after_s=config.model.retry_after_s),
        "ray_actor_options": config.model.actor_options(),
        **({"max_replicas_per_node": config.model.max_replicas_per_node}
           if config.model.max_replicas_per_node else {}),
        # Loading the model takes seconds (a minute on first use, when weights are converted;
        # vLLM compiles its graph on first start).
        "health_check_timeout_s": 300 if config.model.engine == "vllm" else 120,
        "health_check_period_s": config.model.health_check_period_s,
        # A replica scaled down (or redeployed) stops taking requests and finishes those it
        # holds, which the request deadline bounds.
        "graceful_shutdown_timeout_s": config.request_timeout_s or 300,
        **config.model.placement(),
    }
    model = serve.deployment(ModelServer, **model_options).bind(
        settings.fields(), library, engine_factory, config.request_timeout_s or 300)
    ingress = serve.deployment(
        Ingress, name="Ingress", num_replicas=config.ingress_replicas,
        ray_actor_options={"num_cpus": 0.1, **({"resources": dict(config.ingress_resources)}
                                               if config.ingress_resources else {})},
        max_ongoing_requests=config.ingress_max_ongoing_requests,
        # Past this the proxy refuses (429): the model deployment's own queue fills first.
        max_queued_requests=config.ingress_max_ongoing_requests,
        backpressure_config=BackpressureConfig(status_code=429,
                                               retry_after_s=config.model.retry_after_s))
    renderer = config.model.model if config.count_prompt_tokens_at_ingress else None
    keys = ApiKeySource(config.api_keys_file, config.api_keys_env)
    responses = responses_part(config.responses) if config.responses.enabled else None
    return ingress.bind(model, config.policy(), renderer, keys, responses)


def library_part(config: LibraryConfig, index: int) -> Application:
    """The retrieval actor owning part ``index`` of the library's shards (one replica: one
    owner per shard keeps its writers serialised)."""
    deployment = serve.deployment(
        LibraryService, name=library_deployment_name(index, config.actors), num_replicas=1,
        ray_actor_options={"num_cpus": config.num_cpus,
                           **({"resources": dict(config.resources)} if config.resources else {})},
        max_ongoing_requests=config.max_ongoing_requests,
        max_queued_requests=config.max_queued_requests)
    return deployment.bind(config.path, config.shards, config.max_calls, config.seed_file,
                           part=(index, config.actors))


def responses_part(config: ResponsesConfig) -> Application:
    """The response store's actor (one replica: one writer of its file), which every ingress
    replica calls."""
    deployment = serve.deployment(
        ResponseService, name=RESPONSES_DEPLOYMENT, num_replicas=1,
        ray_actor_options={"num_cpus": config.num_cpus,
                           **({"resources": dict(config.resources)} if config.resources else {})},
        max_ongoing_requests=64)  # quick LMDB reads and writes, on the actor's threads
    return deployment.bind(config.path, config.max_age_s, config.max_responses,
                           config.max_bytes)


def app_builder(args: dict[str, Any]) -> Application:
    """Entry point for ``serve_config.yaml`` (``import_path: deployments:app_builder``)."""
    return build_app(AppConfig.model_validate(args or {}))
