"""Per-request tenants: named by the ``x-toolspec-tenant`` header (or the body's ``user``, where
configured), validated at admission, and carried to the replica, whose library lookups and adds
use it — so one tenant's stored calls are never drafted for another."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from serve_fakes import LocalModelClient, ProbingChatEngine, ScriptedChatEngine

from deployments import AppConfig
from deployments.http.admission import AdmissionPolicy
from deployments.http.api import create_api
from deployments.http.tenants import TenantPolicy
from deployments.library.cache import LibraryCache
from deployments.library.service import LibraryService
from deployments.replica.model_replica import ModelReplica
from toolspec.library import CallRecord

MODEL = "toy-model"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
PROBE = '{"name": "get_weather", "arguments": {"city": "'


def client_for(engine: ScriptedChatEngine, tenants: TenantPolicy = TenantPolicy(),
               library: LibraryCache | None = None) -> TestClient:
    replica = ModelReplica(engine, library, name="replica-0")
    return TestClient(create_api(LocalModelClient(replica), AdmissionPolicy((MODEL,),
                                                                            tenants=tenants)))


def post(client: TestClient, tenant: str | None = None, **fields: Any) -> Any:
    headers = {"x-toolspec-tenant": tenant} if tenant is not None else {}
    payload = {"model": MODEL, "tools": [WEATHER],
               "messages": [{"role": "user", "content": "Weather in Oslo?"}], **fields}
    return client.post("/v1/chat/completions", json=payload, headers=headers)


def test_the_header_names_the_tenant_else_the_default() -> None:
    engine = ScriptedChatEngine()
    client = client_for(engine, TenantPolicy(default="shared"))
    assert post(client, "acme").status_code == 200
    assert post(client, user="bob").status_code == 200  # `user` is not mapped by default
    assert [r.tenant for r in engine.requests] == ["acme", "shared"]


def test_user_names_the_tenant_where_configured_and_the_header_wins() -> None:
    engine = ScriptedChatEngine()
    client = client_for(engine, TenantPolicy(from_user=True))
    post(client, user="bob@example.com")
    post(client, "acme", user="bob@example.com")
    post(client)
    assert [r.tenant for r in engine.requests] == ["bob@example.com", "acme", "default"]


def test_a_deployment_without_a_tenant_header_ignores_it() -> None:
    engine = ScriptedChatEngine()
    post(client_for(engine, TenantPolicy(header=None)), "acme")
    assert engine.requests[0].tenant == "default"


@pytest.mark.parametrize("tenant, user, param", [
    ("has space", None, None),
    ("a/b", None, None),
    ("-leading-dash", None, None),
    ("x" * 129, None, None),
    (None, "", "user"),
    (None, "bob\u00e9", "user"),
])
def test_a_bad_tenant_name_is_a_400_error_object(tenant: str | None, user: str | None,
                                                 param: str | None) -> None:
    engine = ScriptedChatEngine()
    client = client_for(engine, TenantPolicy(from_user=True))
    fields = {"user": user} if user is not None else {}
    response = post(client, tenant, **fields)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "invalid_tenant" and error["param"] == param
    assert error["type"] == "invalid_request_error"
    assert not engine.requests  # refused before any replica saw it


def test_app_config_maps_tenant_settings_and_rejects_a_bad_default() -> None:
    tenants = AppConfig(tenant="acme", tenant_header="X-Org", tenant_from_user=True
                        ).policy().tenants
    assert tenants == TenantPolicy("acme", "x-org", True)
    assert AppConfig(tenant_header=None).policy().tenants.header is None
    with pytest.raises(ValueError, match="tenant"):
        AppConfig(tenant="not valid")


class ServiceRemote:
    """The retrieval actor in process: a real ``LibraryService``."""

    def __init__(self, service: LibraryService) -> None:
        self.service = service

    async def top_calls(self, tenant: str, tools: list[str], per_tool: int) -> list[CallRecord]:
        return await self.service.top_calls(tenant, tools, per_tool)

    async def matching_calls(self, tenant: str, tool: str, typed: str, arguments_key: str,
                             k: int) -> tuple[list[CallRecord], bool]:
        return await self.service.matching_calls(tenant, tool, typed, arguments_key, k)

    async def add_calls(self, tenant: str, calls: list[Any]) -> int:
        return await self.service.add_calls(tenant, calls)


def test_one_tenants_calls_are_never_drafted_for_another(tmp_path: Path) -> None:
    service = LibraryService(str(tmp_path / "shared"))
    cache = LibraryCache(ServiceRemote(service))
    engine = ProbingChatEngine([CALL[:30], CALL[30:]], PROBE)
    with client_for(engine, library=cache) as client:
        assert post(client, "acme").status_code == 200  # acme's call: Oslo
        assert post(client, "globex").status_code == 200
        assert post(client, "acme").status_code == 200
        client.portal.call(cache.drain)  # the background sends and lookups are done
    acme_first, globex, acme_again = engine.seen[:2], engine.seen[2:4], engine.seen[4:]
    assert acme_first == [[], []]
    assert globex == [[], []]  # acme's Oslo is in the replica's view, not offered to globex
    assert acme_again == [['Oslo"}}'], ['Oslo"}}']]
    # The shared library holds the calls under their tenants; neither sees the other's.
    assert [r.arguments for r in asyncio.run(service.top_calls("acme", ["get_weather"], 8))] \
        == [{"city": "Oslo"}]
    assert [r.arguments for r in asyncio.run(service.top_calls("globex", ["get_weather"], 8))] \
        == [{"city": "Oslo"}]  # globex's own (identical) call, its own record
    records = {(r.tenant, r.arguments["city"]) for r in service.library.records()}
    assert records == {("acme", "Oslo"), ("globex", "Oslo")}
    assert asyncio.run(ServiceRemote(service).matching_calls(
        "initech", "get_weather", PROBE, "arguments", 8)) == ([], True)
    cache.close()
