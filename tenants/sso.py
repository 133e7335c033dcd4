"""Single sign-on with OpenID Connect (issue 34 item 1; docs/tenancy.md "Single sign-on", docs/security.md).

A tenant names its OpenID provider (issuer, client id and secret, the e-mail domains it vouches for, a default
role, group claims mapped to roles) in its ``TenantSignIn``. A member starts at the sign-in page ("Sign in with
<provider>", found by tenant slug or e-mail domain: ``sign_in_find``); the authorization code flow runs with
state, nonce and PKCE (mozilla-django-oidc's request view and session bookkeeping, ``portal/sso.py``); the
callback spends the state first (a replay finds nothing), exchanges the code at the provider's token endpoint,
and ``TenantOIDCBackend`` checks the ID token: RS256 signature by a key from the provider's JWKS, issuer,
audience (this tenant's client id), expiry, nonce; then the userinfo (same subject, a verified e-mail in an
allowed domain). Only then does ``sso_member_sign_in`` create the user and membership just in time, in one
transaction with its audit row; any refusal raises ``SsoRefused`` with a message a person can act on, before
anything is written.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any
from urllib.parse import urlsplit

import jwt
import requests
from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import SuspiciousOperation
from django.db import transaction
from django.db.models import Q
from mozilla_django_oidc.auth import OIDCAuthenticationBackend

from core.errors import ApplicationError, Conflict, PermissionDenied, ValidationFailed
from tenants.access import Actor
from tenants.audit import audit_record
from tenants.choices import PROJECT_LIMITABLE_ROLES, ROLE_RANK, Role
from tenants.models import Membership, Project, SsoIdentity, Tenant, TenantSignIn
from tenants.sealing import secret_open, secret_seal
from tenants.selectors import project_slugs
from tenants.services import project_ids_for_slugs

SCOPES = "openid email profile"
ALGORITHMS = ["RS256"]
DOMAIN_REGEX = r"^(?=.{1,253}$)([a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?\.)+[a-z]{2,63}$"
BACKEND_PATH = "tenants.sso.TenantOIDCBackend"


class SsoRefused(ApplicationError):
    """A single sign-on that must not succeed; the message says why and what to do."""

    status = 403
    code = "sso_refused"


# --- selectors ----------------------------------------------------------------------------------


def sign_in_get(*, tenant: Tenant) -> TenantSignIn:
    """The tenant's sign-in settings; the defaults (password sign-in, no SSO, no required second factor) when it
    has never set any (not saved)."""
    return TenantSignIn.objects.filter(tenant=tenant).first() or TenantSignIn(tenant=tenant)


def sign_in_find(*, query: str) -> TenantSignIn | None:
    """The SSO settings a sign-in page query names: a tenant slug, an e-mail address or an e-mail domain."""
    query = (query or "").strip().lower()
    if not query:
        return None
    enabled = TenantSignIn.objects.select_related("tenant").filter(sso_enabled=True)
    domain = query.rsplit("@", 1)[1] if "@" in query else query
    return (enabled.filter(tenant__slug=query).first()
            or enabled.filter(allowed_email_domains__contains=[domain]).first())


def password_sign_in_blocker(user) -> TenantSignIn | None:
    """The sign-in settings of a tenant of the user's that switched local passwords off, or None (always None
    for platform staff, who keep their password with the second factor staff always need)."""
    if user.is_staff:
        return None
    return (TenantSignIn.objects.filter(tenant__memberships__user=user, local_passwords_disabled=True)
            .select_related("tenant").order_by("tenant_id").first())


def password_sign_in_refusal(user) -> str | None:
    """Why this user may not sign in with a local password (a tenant of theirs switched passwords off), or
    None."""
    sign_in = password_sign_in_blocker(user)
    return None if sign_in is None else password_refusal_text(sign_in)


def password_refusal_text(sign_in: TenantSignIn) -> str:
    return (f"{sign_in.tenant.name} signs its members in through "
            f"{sign_in.provider_name or 'its identity provider'}: use \"Continue with single sign-on\".")


# --- services -----------------------------------------------------------------------------------


def _validate_issuer(value: str) -> str:
    value = (value or "").strip().rstrip("/")
    parts = urlsplit(value)
    loopback = parts.hostname in ("localhost",) or _is_loopback(parts.hostname)
    if (parts.scheme != "https" and not (parts.scheme == "http" and loopback)) or not parts.hostname:
        raise ValidationFailed("issuer must be an https:// URL (http:// only on the loopback, for a local test "
                               "provider).", field="issuer")
    if parts.query or parts.fragment or len(value) > 300:
        raise ValidationFailed("issuer must be a URL without query or fragment, at most 300 characters.",
                               field="issuer")
    return value


def _is_loopback(host: str | None) -> bool:
    try:
        return host is not None and ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _validate_domains(values, *, tenant: Tenant, claimed: list[str], by) -> list[str]:
    if not isinstance(values, list | tuple) or not all(isinstance(v, str) for v in values):
        raise ValidationFailed("allowed_email_domains must be a list of domain names.", field="allowed_email_domains")
    domains = sorted({v.strip().lower() for v in values})
    for domain in domains:
        if not re.fullmatch(DOMAIN_REGEX, domain):
            raise ValidationFailed(f"allowed_email_domains: '{domain}' is not a domain name.",
                                   field="allowed_email_domains")
    taken = (TenantSignIn.objects.exclude(tenant=tenant).filter(allowed_email_domains__overlap=domains)
             .values_list("allowed_email_domains", flat=True))
    for other in taken:
        clash = sorted(set(other) & set(domains))
        raise Conflict(f"allowed_email_domains: {', '.join(clash)} already belongs to another tenant's single "
                       "sign-on.", field="allowed_email_domains")
    if isinstance(by, Actor) and not by.user.is_staff:
        # an owner may claim a domain only where no account of another tenant, and no staff account, has an
        # address: the sign-in page sends that domain's people to this tenant's provider (staff assign the rest)
        others = get_user_model().objects.filter(
            Q(is_staff=True) | Q(pk__in=Membership.objects.exclude(tenant=tenant).values("user_id")))
        for domain in sorted(set(domains) - set(claimed)):
            if others.filter(email__iendswith=f"@{domain}").exists():
                raise Conflict(f"allowed_email_domains: accounts outside {tenant.name} have addresses in {domain}; "
                               "ask the platform's staff to assign it.", field="allowed_email_domains")
    return domains


def _validate_group_roles(value) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValidationFailed("group_roles must be an object of group name to role.", field="group_roles")
    for group, role in value.items():
        if not isinstance(group, str) or not group.strip() or len(group) > 200:
            raise ValidationFailed("group_roles: every group name must be 1-200 characters.", field="group_roles")
        if role not in Role.values or role == Role.OWNER:
            raise ValidationFailed(f"group_roles: '{role}' (for group '{group}') must be one of admin, member, "
                                   "viewer (owners are made by owners).", field="group_roles")
    return dict(value)


def _validate_group_projects(value, *, tenant: Tenant) -> dict[str, list[int]]:
    """{"group": ["project-slug", ...]} as stored: {"group": [project id, ...]}; an unknown slug names the field."""
    if not isinstance(value, dict):
        raise ValidationFailed("group_projects must be an object of group name to a list of project slugs.",
                               field="group_projects")
    if len(value) > 200:
        raise ValidationFailed("group_projects: at most 200 groups.", field="group_projects")
    mapped = {}
    for group, slugs in value.items():
        if not isinstance(group, str) or not group.strip() or len(group) > 200:
            raise ValidationFailed("group_projects: every group name must be 1-200 characters.",
                                   field="group_projects")
        mapped[group] = project_ids_for_slugs(tenant=tenant, slugs=slugs, field="group_projects")
    return mapped


def group_projects_slugs(sign_in: TenantSignIn) -> dict[str, list[str]]:
    """The stored group → project ids mapping as group → slugs (a deleted project's id is left out)."""
    ids = {pk for values in sign_in.group_projects.values() for pk in values}
    slugs = dict(Project.objects.filter(tenant_id=sign_in.tenant_id, pk__in=ids).values_list("pk", "slug"))
    return {group: sorted(slugs[pk] for pk in values if pk in slugs)
            for group, values in sorted(sign_in.group_projects.items())}


SIGN_IN_FIELDS = ("sso_enabled", "provider_name", "issuer", "client_id", "client_secret", "allowed_email_domains",
                  "default_role", "group_roles", "group_projects", "local_passwords_disabled", "totp_required")


def sign_in_update(*, tenant: Tenant, by, changes: dict[str, Any]) -> TenantSignIn:
    """Change the tenant's sign-in settings (owners; staff). ``changes`` holds only the fields to change
    (``SIGN_IN_FIELDS``); ``client_secret`` is write-only, sealed before it is stored, and its audit row says
    only that it changed. Refused, naming the field, before anything is written: SSO on without an issuer,
    client id or secret; local passwords off without SSO; a domain another tenant's SSO already claims; a
    default role of owner (owners are made by owners, never by a first sign-in). ``by``: the acting
    ``Actor`` (owners only; staff act through ``staff_actor``), or None for a command."""
    if isinstance(by, Actor):
        if by.tenant.pk != tenant.pk:
            raise PermissionDenied("Sign-in settings are changed from inside their own tenant.")
        by.require("own")
    unknown = sorted(set(changes) - set(SIGN_IN_FIELDS))
    if unknown:
        raise ValidationFailed(f"{unknown[0]} is not a sign-in setting.", field=unknown[0])
    with transaction.atomic(durable=True):
        Tenant.objects.select_for_update().get(pk=tenant.pk)
        sign_in = TenantSignIn.objects.select_for_update().filter(tenant=tenant).first() or TenantSignIn(
            tenant=tenant)
        for name in ("sso_enabled", "local_passwords_disabled", "totp_required"):
            if name in changes:
                if not isinstance(changes[name], bool):
                    raise ValidationFailed(f"{name} must be true or false.", field=name)
                setattr(sign_in, name, changes[name])
        if "provider_name" in changes:
            name = str(changes["provider_name"] or "").strip()
            if len(name) > 100:
                raise ValidationFailed("provider_name must be at most 100 characters.", field="provider_name")
            sign_in.provider_name = name
        if "issuer" in changes:
            sign_in.issuer = _validate_issuer(changes["issuer"]) if changes["issuer"] else ""
        if "client_id" in changes:
            client_id = str(changes["client_id"] or "").strip()
            if len(client_id) > 200:
                raise ValidationFailed("client_id must be at most 200 characters.", field="client_id")
            sign_in.client_id = client_id
        if "client_secret" in changes:
            secret = changes["client_secret"]
            if not isinstance(secret, str) or len(secret) > 500:
                raise ValidationFailed("client_secret must be a string of at most 500 characters.",
                                       field="client_secret")
            sign_in.client_secret_sealed = secret_seal(secret)
        if "allowed_email_domains" in changes:
            sign_in.allowed_email_domains = _validate_domains(
                changes["allowed_email_domains"], tenant=tenant, claimed=sign_in.allowed_email_domains, by=by)
        if "default_role" in changes:
            if changes["default_role"] not in Role.values or changes["default_role"] == Role.OWNER:
                raise ValidationFailed("default_role must be one of admin, member, viewer.", field="default_role")
            sign_in.default_role = changes["default_role"]
        if "group_roles" in changes:
            sign_in.group_roles = _validate_group_roles(changes["group_roles"])
        if "group_projects" in changes:
            sign_in.group_projects = _validate_group_projects(changes["group_projects"], tenant=tenant)
        if sign_in.sso_enabled:
            for name, value in (("issuer", sign_in.issuer), ("client_id", sign_in.client_id),
                                ("client_secret", sign_in.client_secret_sealed)):
                if not value:
                    raise ValidationFailed(f"{name} is needed to turn single sign-on on.", field=name)
            if not sign_in.allowed_email_domains:
                raise ValidationFailed("allowed_email_domains: name at least one domain whose addresses the "
                                       "provider may sign in.", field="allowed_email_domains")
        if sign_in.local_passwords_disabled and not sign_in.sso_enabled:
            raise ValidationFailed("local_passwords_disabled needs single sign-on on, or members could not sign "
                                   "in at all.", field="local_passwords_disabled")
        sign_in.save()
        audit_record(tenant=tenant, by=by, action="tenant.sign_in.update", target=tenant.slug, data={
            name: ("changed" if name == "client_secret" else changes[name]) for name in sorted(changes)})
    return sign_in


def _role_for(sign_in: TenantSignIn, groups) -> tuple[Role, list[str]]:
    matched = [group for group in (groups or []) if isinstance(group, str) and group in sign_in.group_roles]
    if not matched:
        return Role(sign_in.default_role), []
    role = max((Role(sign_in.group_roles[g]) for g in matched), key=lambda role: ROLE_RANK[role])
    return (Role.ADMIN if role == Role.OWNER else role), matched  # a mapping stored before owners were refused


def _projects_for(sign_in: TenantSignIn, groups, role: str) -> tuple[list[int] | None, list[str]]:
    """The projects a member or viewer reaches through their groups (the union of the mapped groups'; none
    when no group of theirs is mapped), or None: no mapping is set, or the role reaches every project; with the
    groups that mapped."""
    if not sign_in.group_projects or role not in PROJECT_LIMITABLE_ROLES:
        return None, []
    mapped = [group for group in (groups or []) if isinstance(group, str) and group in sign_in.group_projects]
    existing = set(Project.objects.filter(tenant_id=sign_in.tenant_id).values_list("pk", flat=True))
    return sorted({pk for group in mapped for pk in sign_in.group_projects[group] if pk in existing}), mapped


def _sso_account(*, sign_in: TenantSignIn, subject: str, email: str, claims: dict[str, Any]):
    """The account this subject of the tenant's provider signs in as, and whether it was created: the one linked
    to (issuer, subject); else a new account when no account has the address; else the account of that address,
    linked now, only when the provider gains nothing by it (a member of this tenant and of no other, not staff:
    otherwise any owner naming an address in their provider would sign in as its holder). Inside the caller's
    transaction; refuses (``SsoRefused``) before writing."""
    tenant = sign_in.tenant
    users = get_user_model().objects
    link = (SsoIdentity.objects.select_for_update().select_related("user")
            .filter(issuer=sign_in.issuer, subject=subject).first())
    if link is not None:
        return link.user, False
    found = list(users.select_for_update().filter(email__iexact=email).order_by("pk")[:2])
    if len(found) > 1:
        raise SsoRefused(f"More than one account has the address {email}; ask the platform's staff to merge them.")
    if not found:
        user = users.create_user(username=email[:150], email=email,
                                 first_name=str(claims.get("given_name") or "")[:150],
                                 last_name=str(claims.get("family_name") or "")[:150])
        user.set_unusable_password()
        user.save(update_fields=["password"])
        created = True
    else:
        user, created = found[0], False
        tenants = set(Membership.objects.filter(user=user).values_list("tenant_id", flat=True))
        if user.is_staff or tenants != {tenant.pk}:
            raise SsoRefused(f"An account with the address {email} already exists and {tenant.name}'s provider "
                             "may not take it over: sign in with its password (a member of this tenant only "
                             "is linked at their first single sign-on); nothing was created.")
    SsoIdentity.objects.create(user=user, issuer=sign_in.issuer, subject=subject, tenant=tenant)
    return user, created


def sso_member_sign_in(*, sign_in: TenantSignIn, subject: str, claims: dict[str, Any]):
    """The user the provider vouched for, made a member of the tenant just in time. Refuses (``SsoRefused``),
    writing nothing, an e-mail that is missing, unverified or outside the allowed domains; a closed tenant; a new
    member of a suspended tenant; platform staff (they sign in with their password and second factor); an
    existing account the provider may not take over (``_sso_account``). A new member gets the role of their
    highest mapped group, else the default role (never owner); a member's role follows the mapped groups at each
    sign-in (never an owner's: owners are managed in the broker). When the tenant maps groups to projects, a
    member's or viewer's projects are those of their mapped groups, set at each sign-in. One transaction with its
    audit rows."""
    tenant = sign_in.tenant
    if tenant.closed_at is not None:
        raise SsoRefused(f"{tenant.name} is closed; nobody signs in to it.")
    email = str(claims.get("email") or "").strip().lower()
    if not email or "@" not in email:
        raise SsoRefused("The identity provider sent no e-mail address; ask it to release the 'email' claim.")
    if claims.get("email_verified") is False:
        raise SsoRefused(f"The identity provider has not verified {email}; verify it there first.")
    domain = email.rsplit("@", 1)[1]
    if domain not in sign_in.allowed_email_domains:
        raise SsoRefused(f"{email} is not in a domain {tenant.name} allows for single sign-on "
                         f"({', '.join(sign_in.allowed_email_domains)}); nothing was created.")
    role, matched = _role_for(sign_in, claims.get("groups"))
    with transaction.atomic(durable=True):
        user, created = _sso_account(sign_in=sign_in, subject=subject, email=email, claims=claims)
        if user.is_staff:
            raise SsoRefused("Platform staff sign in with their password and second factor, not through a "
                             "tenant's provider.")
        if not user.is_active:
            raise SsoRefused(f"The account of {email} is disabled; ask the platform's staff.")
        membership = Membership.objects.select_for_update().filter(user=user, tenant=tenant).first()
        if membership is None:
            if not tenant.is_active:
                raise SsoRefused(f"{tenant.name} is suspended and takes no new members; nothing was created.")
            project_ids, _mapped = _projects_for(sign_in, claims.get("groups"), role)
            membership = Membership.objects.create(user=user, tenant=tenant, role=role, project_ids=project_ids)
            audit_record(tenant=tenant, by=user, action="membership.create", target=email,
                         data={"role": role, "via": "sso", "groups": matched,
                               "projects": project_slugs(tenant=tenant, ids=project_ids)})
        else:
            if matched and membership.role != Role.OWNER and membership.role != role:
                audit_record(tenant=tenant, by=user, action="membership.role", target=email,
                             data={"from": membership.role, "to": role, "via": "sso", "groups": matched})
                membership.role = role
                if role not in PROJECT_LIMITABLE_ROLES:
                    membership.project_ids = None  # admins reach the whole tenant
                Membership.objects.filter(pk=membership.pk).update(role=role, project_ids=membership.project_ids)
            project_ids, mapped = _projects_for(sign_in, claims.get("groups"), membership.role)
            if sign_in.group_projects and membership.role in PROJECT_LIMITABLE_ROLES \
                    and membership.project_ids != project_ids:
                audit_record(tenant=tenant, by=user, action="membership.projects", target=email,
                             data={"from": project_slugs(tenant=tenant, ids=membership.project_ids),
                                   "to": project_slugs(tenant=tenant, ids=project_ids), "via": "sso",
                                   "groups": mapped})
                Membership.objects.filter(pk=membership.pk).update(project_ids=project_ids)
        audit_record(tenant=tenant, by=user, action="sso.sign_in", target=email,
                     data={"issuer": sign_in.issuer, "subject": subject, "user_created": created})
    return user


# --- the provider -------------------------------------------------------------------------------


def provider_metadata(issuer: str) -> dict[str, Any]:
    """The provider's discovery document, checked to name the same issuer (OpenID Connect Discovery §4.3)."""
    url = issuer.rstrip("/") + "/.well-known/openid-configuration"
    try:
        response = requests.get(url, timeout=settings.OIDC_TIMEOUT)
        response.raise_for_status()
        metadata = response.json()
    except (requests.RequestException, ValueError) as error:
        raise SsoRefused(f"The identity provider at {issuer} did not answer its discovery document ({error}); "
                         "try again later or ask the tenant's owner to check the issuer.") from None
    if str(metadata.get("issuer", "")).rstrip("/") != issuer.rstrip("/"):
        raise SsoRefused(f"The provider's discovery document names issuer {metadata.get('issuer')!r}, not "
                         f"{issuer!r}; the tenant's issuer setting is wrong.")
    for key in ("authorization_endpoint", "token_endpoint", "jwks_uri", "userinfo_endpoint"):
        if not metadata.get(key):
            raise SsoRefused(f"The provider's discovery document has no {key}.")
    return metadata


class TenantOIDCBackend(OIDCAuthenticationBackend):
    """mozilla-django-oidc's backend with the provider and client of one tenant (not the global settings it
    reads by default), and the ID token checked in full (its own check skips audience and issuer)."""

    def __init__(self, *args, **kwargs):  # the library reads global OIDC_* settings here; ours are per tenant
        self.UserModel = get_user_model()

    def authenticate(self, request, sso_tenant_id=None, nonce=None, code_verifier=None, **kwargs):
        if request is None or sso_tenant_id is None:
            return None  # a password sign-in: not ours
        sign_in = TenantSignIn.objects.select_related("tenant").filter(tenant_id=sso_tenant_id,
                                                                      sso_enabled=True).first()
        if sign_in is None:
            raise SsoRefused("This tenant no longer signs in with single sign-on; use its sign-in page.")
        metadata = provider_metadata(sign_in.issuer)
        self.sign_in = sign_in
        self.OIDC_OP_TOKEN_ENDPOINT = metadata["token_endpoint"]
        self.OIDC_OP_USER_ENDPOINT = metadata["userinfo_endpoint"]
        self.OIDC_OP_JWKS_ENDPOINT = metadata["jwks_uri"]
        self.OIDC_RP_CLIENT_ID = sign_in.client_id
        self.OIDC_RP_CLIENT_SECRET = secret_open(sign_in.client_secret_sealed)
        self.OIDC_RP_SIGN_ALGO = "RS256"
        self.OIDC_RP_IDP_SIGN_KEY = None
        try:
            return super().authenticate(request, nonce=nonce, code_verifier=code_verifier)
        except requests.HTTPError as error:
            status = error.response.status_code if error.response is not None else None
            detail = ""
            if error.response is not None and "json" in error.response.headers.get("content-type", ""):
                body = error.response.json()
                detail = f": {body.get('error')} {body.get('error_description', '')}".rstrip()
            raise SsoRefused(f"The identity provider refused to exchange the sign-in code (HTTP {status}{detail}); "
                             "start again from the sign-in page.") from None
        except requests.RequestException as error:
            raise SsoRefused(f"The identity provider could not be reached ({error.__class__.__name__}); try "
                             "again later.") from None
        except SuspiciousOperation as error:
            raise SsoRefused(f"The identity provider's answer was refused: {error}.") from None

    def verify_token(self, token, **kwargs):
        if not token:
            raise SsoRefused("The identity provider returned no ID token.")
        key = self.retrieve_matching_jwk(token)
        try:
            payload = jwt.decode(token, key, algorithms=ALGORITHMS, audience=self.OIDC_RP_CLIENT_ID,
                                 issuer=self.sign_in.issuer, leeway=settings.OIDC_CLOCK_SKEW_SECONDS,
                                 options={"require": ["iss", "sub", "aud", "exp", "iat"]})
        except jwt.ExpiredSignatureError:
            raise SsoRefused("The identity provider's ID token has expired (check the clocks of both sides); "
                             "sign in again.") from None
        except jwt.InvalidAudienceError:
            raise SsoRefused("The ID token was issued for another client (its audience is not this tenant's "
                             "client id); refused.") from None
        except jwt.InvalidIssuerError:
            raise SsoRefused("The ID token was issued by another provider than this tenant's issuer; "
                             "refused.") from None
        except jwt.PyJWTError as error:
            raise SsoRefused(f"The ID token is not valid ({error}); refused.") from None
        if "nonce" in kwargs and payload.get("nonce") != kwargs["nonce"]:
            raise SsoRefused("The ID token does not answer this sign-in (nonce mismatch); refused.")
        return payload

    def get_or_create_user(self, access_token, id_token, payload):
        claims = self.get_userinfo(access_token, id_token, payload)
        if claims.get("sub") != payload.get("sub"):
            raise SsoRefused("The provider's userinfo names another subject than its ID token; refused.")
        merged = {**payload, **claims}
        return sso_member_sign_in(sign_in=self.sign_in, subject=str(payload["sub"]), claims=merged)

    def get_user(self, user_id):  # the library's skips ModelBackend's is_active check: keep it
        return ModelBackend.get_user(self, user_id)

    def store_tokens(self, access_token, id_token):
        self.request.session["oidc_id_token"] = id_token  # the id_token_hint of the sign-out
        self.request.session["oidc_tenant_id"] = self.sign_in.tenant_id
