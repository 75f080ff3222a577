"""A replica's per-tenant suffix caches: one tenant's outputs never shape another's drafts."""

from __future__ import annotations

from deployments.chat_engine import TenantSuffixCaches


def test_each_tenant_gets_its_own_cache_and_keeps_it() -> None:
    caches = TenantSuffixCaches()
    acme = caches.get("acme")
    acme.add([1, 2, 3])
    assert caches.get("acme") is acme
    assert (1, 2) not in caches.get("globex").trie.counts()


def test_least_recently_used_tenant_is_dropped_beyond_the_cap() -> None:
    caches = TenantSuffixCaches(max_tenants=2)
    a, b = caches.get("a"), caches.get("b")
    caches.get("a")  # a is now the most recent
    caches.get("c")  # b goes
    assert caches.get("a") is a
    assert caches.get("b") is not b
