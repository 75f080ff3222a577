"""Which tenant a request belongs to: whose stored calls and past outputs may be drafted for it.

A tenant is named by the ``x-toolspec-tenant`` header (the header name is configurable), else —
when the deployment maps it — by the body's OpenAI ``user`` field, else it is the deployment's
default tenant. One tenant's calls and outputs are never drafted for another; the call library,
the per-tenant suffix caches and the session KV caches are all keyed by it.

The header is trusted: nothing here authenticates it. A deployment shared by several customers
puts a gateway in front that authenticates the caller and sets (or strips) the header.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

TENANT_HEADER = "x-toolspec-tenant"
#: Tenant names: ASCII letters, digits and ``. _ @ : + -``, up to 128 characters, starting with
#: a letter or digit (user ids, e-mail addresses and UUIDs fit; ``/`` and spaces do not).
TENANT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}$"
_TENANT = re.compile(TENANT_PATTERN)


class TenantError(ValueError):
    """A request names a tenant that is not a valid name; ``param`` is where it came from
    (``user``, or None for the header)."""

    def __init__(self, message: str, param: str | None) -> None:
        super().__init__(message)
        self.param = param


def valid_tenant(name: str) -> bool:
    return _TENANT.fullmatch(name) is not None


@dataclass(frozen=True)
class TenantPolicy:
    """How requests name their tenant. ``header``: the header that names it (None: requests
    cannot); ``from_user``: use the body's ``user`` when the header is absent."""

    default: str = "default"
    header: str | None = TENANT_HEADER
    from_user: bool = False

    def __post_init__(self) -> None:
        if not valid_tenant(self.default):
            raise ValueError(f"the default tenant {self.default!r} does not match "
                             f"{TENANT_PATTERN}")

    def header_value(self, headers: Mapping[str, str]) -> str | None:
        """The tenant header's value in ``headers`` (None when absent or not configured)."""
        return headers.get(self.header) if self.header else None

    def resolve(self, header_value: str | None, user: str | None) -> str:
        """The request's tenant; raises TenantError for a name that is not valid."""
        if header_value is not None:
            return _checked(header_value, None, f"the {self.header} header")
        if self.from_user and user is not None:
            return _checked(user, "user", "the user field (it names the tenant here)")
        return self.default


def _checked(name: str, param: str | None, where: str) -> str:
    if not valid_tenant(name):
        raise TenantError(f"{where} must be a tenant name of 1-128 characters from letters, "
                          f"digits and . _ @ : + - (starting with a letter or digit), got "
                          f"{name[:40]!r}", param)
    return name
