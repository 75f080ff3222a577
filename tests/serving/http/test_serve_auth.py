"""API keys: a bearer key names its tenant; no key or a wrong one is a 401 error object; the
keys come from a file (read again when it changes) or an environment variable, never from the
config in clear."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from serve_fakes import LocalModelClient, ScriptedChatEngine

from deployments.app.builder import AppConfig
from deployments.http.admission import AdmissionError, AdmissionPolicy
from deployments.http.api import create_api
from deployments.http.auth import ApiKeyConfigError, ApiKeys, ApiKeySource, digest, main, parse_keys
from deployments.replica.model_replica import ModelReplica

ALICE_KEY = "tsk-alice-0123456789abcdef"
BOB_KEY = "tsk-bob-0123456789abcdefgh"
KEY_FILE = f"""# keys of the deployment
{ALICE_KEY} alice
sha256:{digest(BOB_KEY)} bob   # held as its digest only
"""


def client_with(keys: ApiKeys | None, engine: ScriptedChatEngine) -> TestClient:
    api = create_api(LocalModelClient(ModelReplica(engine, name="replica-0")),
                     AdmissionPolicy(("toy-model",)), keys=keys)
    return TestClient(api)


def chat(client: TestClient, key: str | None, **headers: str):  # noqa: ANN201 - a response
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return client.post("/v1/chat/completions", headers=headers, json={
        "model": "toy-model", "messages": [{"role": "user", "content": "hi"}]})


def test_key_lines_clear_or_hashed_name_their_tenants() -> None:
    tenants = parse_keys(KEY_FILE, "keys")
    assert tenants == {digest(ALICE_KEY): "alice", digest(BOB_KEY): "bob"}
    keys = ApiKeys(tenants)
    assert keys.tenant(f"Bearer {ALICE_KEY}") == "alice"
    assert keys.tenant(f"bearer {BOB_KEY}") == "bob"


@pytest.mark.parametrize("text, complaint", [
    ("short alice", "at least"),
    (f"{ALICE_KEY}", "expected"),
    (f"{ALICE_KEY} not/a/tenant", "tenant"),
    ("sha256:abc alice", "64 hex"),
])
def test_bad_key_lines_are_refused_with_their_line(text: str, complaint: str) -> None:
    with pytest.raises(ApiKeyConfigError, match=complaint) as error:
        parse_keys(f"# first\n{text}\n", "keys.txt")
    assert "keys.txt, line 2" in str(error.value)


@pytest.mark.parametrize("authorization", [None, "", "Bearer", "Basic abc",
                                          "Bearer tsk-wrong-0123456789abcdef"])
def test_no_key_or_a_wrong_one_is_a_401(authorization: str | None) -> None:
    keys = ApiKeys(parse_keys(KEY_FILE, "keys"))
    with pytest.raises(AdmissionError) as error:
        keys.tenant(authorization)
    assert error.value.status == 401 and error.value.code == "invalid_api_key"
    assert "0123456789" not in error.value.message  # the key is not echoed whole


def test_the_key_names_the_tenant_and_the_header_cannot() -> None:
    engine = ScriptedChatEngine()
    client = client_with(ApiKeys(parse_keys(KEY_FILE, "keys")), engine)
    response = chat(client, BOB_KEY, **{"x-toolspec-tenant": "alice"})
    assert response.status_code == 200
    assert engine.requests[-1].tenant == "bob"
    for key in (None, "tsk-wrong-0123456789abcdef"):
        refused = chat(client, key)
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"] == "Bearer"
        assert refused.json()["error"]["code"] == "invalid_api_key"
    assert client.get("/v1/models").status_code == 401
    assert client.get("/v1/models", headers={"Authorization": f"Bearer {ALICE_KEY}"}
                      ).status_code == 200
    assert client.get("/health").status_code == 200  # probes need no key
    assert len(engine.requests) == 1  # refused requests never reached a replica


def test_without_keys_the_header_names_the_tenant() -> None:
    engine = ScriptedChatEngine()
    response = chat(client_with(None, engine), "anything", **{"x-toolspec-tenant": "alice"})
    assert response.status_code == 200 and engine.requests[-1].tenant == "alice"


def test_a_key_file_is_read_again_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "keys.txt"
    path.write_text(KEY_FILE)
    keys = ApiKeySource(file=str(path)).load()
    keys.recheck_s = 0.0
    assert keys.tenant(f"Bearer {ALICE_KEY}") == "alice"
    path.write_text(f"sha256:{digest(BOB_KEY)} bob\n")  # alice's key revoked
    later = time.time() + 5
    os.utime(path, (later, later))
    with pytest.raises(AdmissionError):
        keys.tenant(f"Bearer {ALICE_KEY}")
    path.write_text("garbage line here\n")  # a broken file keeps the keys read before
    os.utime(path, (later + 5, later + 5))
    assert keys.tenant(f"Bearer {BOB_KEY}") == "bob"


def test_keys_from_the_environment_and_missing_sources(monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    monkeypatch.setenv("TOOLSPEC_TEST_KEYS", f"{ALICE_KEY} alice,sha256:{digest(BOB_KEY)} bob")
    keys = ApiKeySource(env="TOOLSPEC_TEST_KEYS").load()
    assert len(keys) == 2 and keys.tenant(f"Bearer {BOB_KEY}") == "bob"
    with pytest.raises(ApiKeyConfigError, match="not set"):
        ApiKeySource(env="TOOLSPEC_TEST_NO_SUCH_VARIABLE").load()
    with pytest.raises(ApiKeyConfigError, match="cannot be read"):
        ApiKeySource(file=str(tmp_path / "absent")).load()


def test_the_config_names_where_keys_are_and_a_new_key_comes_with_its_line(
        capsys: pytest.CaptureFixture[str]) -> None:
    config = AppConfig.model_validate({"api_keys_file": "/etc/toolspec/keys"})
    assert config.api_keys_file == "/etc/toolspec/keys" and config.api_keys_env is None
    assert main(["new", "team-a"]) == 0
    out = capsys.readouterr().out.splitlines()
    key = out[0].split(": ", 1)[1]
    line = out[1].split(": ", 1)[1]
    assert ApiKeys(parse_keys(line, "new")).tenant(f"Bearer {key}") == "team-a"
    assert key not in line
