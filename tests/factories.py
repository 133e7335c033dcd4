"""Test data in one place. Builders go through the services where a rule applies."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from tenants import services
from tenants.access import Actor
from tenants.choices import Role
from tenants.models import ApiToken, Membership, Project, Quota, Tenant


def make_tenant(slug: str, **kwargs) -> Tenant:
    return services.tenant_create(
        name=kwargs.pop("name", slug.title()), slug=slug, billing_email=f"billing@{slug}.example", **kwargs
    )


def make_user(username: str, **kwargs):
    return get_user_model().objects.create_user(username=username, password="pw-" + username, **kwargs)


def make_member(tenant: Tenant, username: str, role: str = Role.MEMBER):
    user = make_user(username)
    Membership.objects.create(user=user, tenant=tenant, role=role)
    return user


def make_token(tenant: Tenant, user, scopes=("read", "write"), **kwargs) -> tuple[ApiToken, str]:
    role = Membership.objects.get(user=user, tenant=tenant).role
    return services.api_token_create(
        actor=Actor(user=user, tenant=tenant, role=Role(role)), name=kwargs.pop("name", "test"),
        scopes=list(scopes), **kwargs,
    )


def make_project(tenant: Tenant, slug: str, **kwargs) -> Project:
    return Project.objects.create(tenant=tenant, slug=slug, name=kwargs.pop("name", slug.title()), **kwargs)


def make_quota(project: Project, tier="H100-80GB", deserved=1000, limit=2000, tenant_deserved=None,
               tenant_limit=None) -> Quota:
    services.tenant_quota_set(
        tenant=project.tenant, tier=tier, deserved_gpu_milli=tenant_deserved or deserved * 4,
        limit_gpu_milli=tenant_limit or limit * 4,
    )
    return services.quota_set(project=project, tier=tier, deserved_gpu_milli=deserved, limit_gpu_milli=limit)


def api_client(token: str | None = None) -> APIClient:
    client = APIClient()
    if token:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    return client


@dataclass
class World:
    """Two tenants (Healthchecks' alice and bob style): everything of acme, and an outsider, globex."""

    acme: Tenant
    globex: Tenant
    owner: object
    admin: object
    member: object
    viewer: object
    outsider: object
    project: Project
    other_project: Project
    tokens: dict[str, str]

    def client(self, who: str) -> APIClient:
        return api_client(self.tokens[who])


def make_world() -> World:
    acme, globex = make_tenant("acme"), make_tenant("globex")
    owner = make_member(acme, "alice", Role.OWNER)
    admin = make_member(acme, "ann", Role.ADMIN)
    member = make_member(acme, "max", Role.MEMBER)
    viewer = make_member(acme, "vic", Role.VIEWER)
    outsider = make_member(globex, "bob", Role.OWNER)
    project = make_project(acme, "vision")
    other_project = make_project(globex, "secret")
    make_quota(project)
    make_quota(other_project)
    tokens = {}
    for name, tenant, user in [("owner", acme, owner), ("admin", acme, admin), ("member", acme, member),
                               ("outsider", globex, outsider)]:
        tokens[name] = make_token(tenant, user)[1]
    tokens["viewer"] = make_token(acme, viewer, scopes=("read",))[1]
    tokens["owner_read"] = make_token(acme, owner, scopes=("read",))[1]
    return World(acme, globex, owner, admin, member, viewer, outsider, project, other_project, tokens)
