"""API keys: optional bearer keys, each mapped to the tenant it authenticates.

With keys configured, every ``/v1/*`` request must send ``Authorization: Bearer <key>``; a
missing or unknown key is answered 401 with an OpenAI error object (``invalid_api_key``), and
the request's tenant is the key's — the tenant header and the ``user`` field no longer name
it, since anyone can set those. Without keys the deployment trusts the header, as before.

Keys come from a file (a mounted secret) or an environment variable of the ingress's
processes, never from ``serve_config.yaml``: one entry per line, ``<key> <tenant>``, where the
key may be given as ``sha256:<hex digest>`` so that the file itself holds no usable key
(``python -m deployments.http.auth new TENANT`` makes a key and its line). Blank lines and ``#``
comments are skipped. A key file is read again when it changes (checked every few seconds),
so keys are added and revoked without a redeploy.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from deployments.http.admission import AdmissionError
from deployments.http.tenants import TENANT_PATTERN, valid_tenant

logger = logging.getLogger(f"ray.serve.{__name__}")  # into the ingress's Serve log
_DIGEST_PREFIX = "sha256:"
MIN_KEY_LENGTH = 20  # shorter keys are guessable; refused when the keys are read


class ApiKeyConfigError(ValueError):
    """The key file or variable holds an entry that cannot be used (says which line)."""


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def parse_keys(text: str, where: str) -> dict[str, str]:
    """``{sha256 digest of the key: tenant}`` from key-file text. Raises ApiKeyConfigError."""
    tenants: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ApiKeyConfigError(f"{where}, line {number}: expected '<key> <tenant>'")
        key, tenant = parts
        if not valid_tenant(tenant):
            raise ApiKeyConfigError(f"{where}, line {number}: the tenant must match "
                                    f"{TENANT_PATTERN}")
        if key.startswith(_DIGEST_PREFIX):
            hashed = key[len(_DIGEST_PREFIX):].lower()
            if len(hashed) != 64 or any(c not in "0123456789abcdef" for c in hashed):
                raise ApiKeyConfigError(f"{where}, line {number}: a sha256: entry needs the "
                                        f"64 hex digits of the key's SHA-256")
        elif len(key) < MIN_KEY_LENGTH:
            raise ApiKeyConfigError(f"{where}, line {number}: keys must be at least "
                                    f"{MIN_KEY_LENGTH} characters")
        else:
            hashed = digest(key)
        tenants[hashed] = tenant
    return tenants


@dataclass(frozen=True)
class ApiKeySource:
    """Where the keys are: a ``file`` on the ingress's node, or the environment variable
    ``env`` of its processes (entries separated by newlines or commas); None, None: no keys."""

    file: str | None = None
    env: str | None = None

    @property
    def configured(self) -> bool:
        return self.file is not None or self.env is not None

    def load(self) -> ApiKeys:
        """The keys as they are now. Raises ApiKeyConfigError (a missing file or variable
        included: a deployment that asked for keys must not start open)."""
        tenants: dict[str, str] = {}
        if self.env is not None:
            text = os.environ.get(self.env)
            if text is None:
                raise ApiKeyConfigError(f"the API key variable {self.env} is not set in the "
                                        "ingress's environment")
            tenants.update(parse_keys(text.replace(",", "\n"), f"${self.env}"))
        if self.file is not None:
            try:
                tenants.update(parse_keys(Path(self.file).read_text(), self.file))
            except OSError as error:
                raise ApiKeyConfigError(f"the API key file {self.file} cannot be read: "
                                        f"{error.strerror}") from None
        return ApiKeys(tenants, self)


class ApiKeys:
    """The keys a deployment accepts. Mutates: reloads itself when its file changes."""

    def __init__(self, tenants: dict[str, str], source: ApiKeySource | None = None,
                 recheck_s: float = 5.0) -> None:
        self._tenants = tenants
        self.source = source
        self.recheck_s = recheck_s
        self._checked = time.monotonic()
        self._mtime = _mtime(source.file) if source is not None and source.file else None

    def __len__(self) -> int:
        return len(self._tenants)

    def tenant(self, authorization: str | None) -> str:
        """The tenant of the bearer key in the ``Authorization`` header's value. Raises
        AdmissionError (401) for no key, or one this deployment does not know."""
        self._reload_if_changed()
        scheme, _, key = (authorization or "").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise _unauthorized("no API key: send it as 'Authorization: Bearer <key>'")
        tenant = self._tenants.get(digest(key))
        if tenant is None:
            shown = f"{key[:3]}...{key[-4:]}" if len(key) > 10 else "***"
            raise _unauthorized(f"incorrect API key provided: {shown}")
        return tenant

    def _reload_if_changed(self) -> None:
        source = self.source
        if source is None or source.file is None:
            return
        now = time.monotonic()
        if now - self._checked < self.recheck_s:
            return
        self._checked = now
        mtime = _mtime(source.file)
        if mtime == self._mtime:
            return
        try:
            self._tenants = source.load()._tenants
            self._mtime = mtime
        except ApiKeyConfigError as error:  # keep serving with the keys read before
            logger.error("API keys not reloaded, the previous ones stay: %s", error)


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _unauthorized(message: str) -> AdmissionError:
    return AdmissionError(401, message, code="invalid_api_key")


def main(argv: list[str]) -> int:
    """``python -m deployments.http.auth new TENANT``: a fresh key, and the key-file line that
    accepts it without holding it (its SHA-256)."""
    if len(argv) != 2 or argv[0] != "new" or not valid_tenant(argv[1]):
        print("usage: python -m deployments.http.auth new TENANT", file=sys.stderr)
        return 2
    key = "tsk-" + secrets.token_urlsafe(32)
    print(f"key (give it to the client): {key}")
    print(f"key-file line: {_DIGEST_PREFIX}{digest(key)} {argv[1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
