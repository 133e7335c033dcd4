"""A tenant leaving: the export of everything it owns, and its closure (docs/tenancy.md "Export" and "Closure").

**Export.** ``tenant_export_request`` (an owner) records a pending ``TenantExport`` with its audit row and, after
commit, sends ``tenants.export_build``; the task calls ``tenant_export_build``, which writes one zip under
``EXPORT_DIR``: every registered part's files (tenants: the tenant, members, projects and quotas, API tokens
without secrets, the audit trail; the broker: leases and lease events; billing: metered usage, every invoice as
CSV and PDF) and ``manifest.json`` with each file's size and SHA-256. The export row then holds the zip's size
and SHA-256; the owners download it (``GET /api/v1/tenant/exports/{id}/archive``).

**Closure.** ``tenant_close`` (an owner, naming the tenant's slug to confirm) is refused while any registered
check objects (the broker: leases that hold or wait for capacity); it then runs the registered final steps (billing:
every invoice of the tenant up to this month built and finalized, "the final invoice issued"), and in one
transaction: the members' personal data removed (a user who belongs to no other tenant gets a pseudonym
``closed-<tenant>-<user>``, no e-mail, no name, no usable password, and is deactivated; every membership of the
tenant is removed, its tokens revoked), the sign-in addresses and usernames in the tenant's audit trail replaced
by the same pseudonyms (the one UPDATE the audit trigger lets through, under ``gpubroker.audit_pseudonymise``),
the billing e-mail replaced, and the tenant suspended for good (``closed_at``). Financial records (invoices,
their lines, metered usage, leases) are kept.

The broker and billing sit above tenants, so they register their parts, checks and steps in their
``AppConfig.ready`` (as for ``tenants.extensions``): tenants never imports them.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import zipfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from django.conf import settings
from django.db import connection, transaction
from django.db.models import QuerySet
from django.utils import timezone

from core.errors import Conflict, NotFound, PermissionDenied, ValidationFailed
from tenants.access import Actor, restrict
from tenants.audit import audit_record
from tenants.choices import Role, TenantStatus
from tenants.models import (
    ApiToken,
    AuditEvent,
    Invitation,
    Membership,
    Project,
    SsoIdentity,
    Tenant,
    TenantExport,
    TenantSignIn,
)

ExportPart = Callable[[Tenant], dict[str, bytes]]  # tenant → {path inside the zip: content}
ClosureCheck = Callable[[Tenant], str | None]  # tenant → why it cannot close now, or None
ClosureStep = Callable[[Tenant, datetime], dict]  # (tenant, now) → what it did, for the audit row

_parts: dict[str, ExportPart] = {}
_checks: dict[str, ClosureCheck] = {}
_steps: dict[str, ClosureStep] = {}


def export_part_register(name: str, part: ExportPart) -> Callable[[], None]:
    _parts[name] = part
    return lambda: _parts.pop(name, None)


def closure_check_register(name: str, check: ClosureCheck) -> Callable[[], None]:
    _checks[name] = check
    return lambda: _checks.pop(name, None)


def closure_step_register(name: str, step: ClosureStep) -> Callable[[], None]:
    _steps[name] = step
    return lambda: _steps.pop(name, None)


def _require_owner(actor: Actor, doing: str) -> None:
    """Owners only, with a write token when a token acts, never a project-limited one. Allowed while the
    tenant is suspended: taking one's data out and leaving give nothing new."""
    if not actor.can_write:
        raise PermissionDenied("This API token has read scope only.")
    if actor.project_ids is not None:
        raise PermissionDenied("This API token is limited to named projects; it cannot act on the tenant as a "
                               "whole.")
    if actor.role != Role.OWNER:
        raise PermissionDenied(f"Only an owner of '{actor.tenant.slug}' may {doing}.")


# -- export ------------------------------------------------------------------------------------------------------
def tenant_export_list(*, actor: Actor) -> QuerySet[TenantExport]:
    """The tenant's exports, newest first: its owners'."""
    if actor.role != Role.OWNER or actor.project_ids is not None:
        raise PermissionDenied("A tenant's exports are its owners'.")
    return restrict(TenantExport.objects.select_related("requested_by"), actor).order_by("-requested_at", "-id")


def tenant_export_get(*, actor: Actor, pk: int) -> TenantExport:
    export = tenant_export_list(actor=actor).filter(pk=pk).first()
    if export is None:
        raise NotFound("No such export.")
    return export


def tenant_export_request(*, actor: Actor, now: datetime | None = None) -> TenantExport:
    """Record an export to build (pending) with its audit row; the build is sent to a worker after commit."""
    _require_owner(actor, "export the tenant's data")
    if actor.tenant.closed_at is not None:
        raise Conflict(f"Tenant '{actor.tenant.slug}' is closed.", field="tenant")
    now = now or timezone.now()
    with transaction.atomic(durable=True):
        export = TenantExport.objects.create(tenant=actor.tenant, requested_by=actor.user, requested_at=now)
        audit_record(tenant=actor.tenant, by=actor.user, action="tenant.export", target=f"export-{export.pk}")
        export_id = export.pk
        transaction.on_commit(lambda: _build_later(export_id))
    return export


def _build_later(export_id: int) -> None:
    from core.task_registry import task

    task("tenants", "export_build").delay(export_id)


def export_path(export: TenantExport) -> Path:
    return Path(settings.EXPORT_DIR) / f"{export.tenant.slug}-export-{export.pk}.zip"


def csv_bytes(header: list[str], rows) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue().encode()


def _tenants_part(tenant: Tenant) -> dict[str, bytes]:
    """What tenants holds of the tenant: itself, members, projects and quotas, tokens (no secret), audit trail."""
    about = {"slug": tenant.slug, "name": tenant.name, "status": tenant.status, "currency": tenant.currency,
             "billing_email": tenant.billing_email, "created_at": tenant.created_at.isoformat()}
    members = Membership.objects.filter(tenant=tenant).select_related("user").order_by("user__username")
    projects = Project.objects.filter(tenant=tenant).prefetch_related("quotas").order_by("slug")
    slugs = {project.pk: project.slug for project in projects}
    tokens = ApiToken.objects.filter(tenant=tenant).select_related("user").order_by("created_at", "id")
    events = AuditEvent.objects.filter(tenant=tenant).select_related("actor").order_by("created_at", "id")
    stamp = lambda moment: moment.isoformat() if moment else ""  # noqa: E731
    return {
        "tenant.json": json.dumps(about, indent=2, sort_keys=True).encode(),
        "members.csv": csv_bytes(["username", "email", "role", "member_since"],
                            ([m.user.get_username(), m.user.email, m.role, stamp(m.created_at)] for m in members)),
        "projects.json": json.dumps([
            {"slug": p.slug, "name": p.name, "description": p.description, "status": p.status,
             "created_at": stamp(p.created_at),
             "quotas": [{"tier": q.tier, "deserved_gpu_milli": q.deserved_gpu_milli,
                         "limit_gpu_milli": q.limit_gpu_milli, "over_quota_weight": q.over_quota_weight}
                        for q in p.quotas.all()]} for p in projects], indent=2).encode(),
        "api_tokens.csv": csv_bytes(["prefix", "name", "username", "scopes", "projects", "created_at", "expires_at",
                                "last_used_at", "revoked_at"],
                               ([t.prefix, t.name, t.user.get_username(), " ".join(t.scopes),
                                 "" if t.project_ids is None else " ".join(slugs.get(pk, f"#{pk}")
                                                                            for pk in t.project_ids),
                                 stamp(t.created_at), stamp(t.expires_at), stamp(t.last_used_at),
                                 stamp(t.revoked_at)] for t in tokens)),
        "audit_events.csv": csv_bytes(["id", "created_at", "actor", "kind", "object", "data"],
                                 ([e.pk, stamp(e.created_at), e.actor.get_username() if e.actor else "", e.action,
                                   e.target, json.dumps(e.data, sort_keys=True)] for e in events)),
    }


export_part_register("tenants", _tenants_part)


def tenant_export_build(*, export_id: int, now: datetime | None = None) -> TenantExport:
    """Write the zip of a pending export and mark it ready (or failed, with why). Idempotent: an export that is
    no longer pending is returned as it is. The zip is written to a temporary name and renamed, so a crash
    leaves no half-written archive under the export's name; the row changes by a conditional update."""
    export = TenantExport.objects.select_related("tenant").filter(pk=export_id).first()
    if export is None or export.state != TenantExport.State.PENDING:
        return export
    now = now or timezone.now()
    files: dict[str, bytes] = {}
    for name in sorted(_parts):
        for path, content in _parts[name](export.tenant).items():
            if path in files or path == "manifest.json":
                raise ValueError(f"export part {name!r} writes {path!r} twice")
            files[path] = content
    manifest = {"tenant": export.tenant.slug, "export": export.pk, "created_at": now.isoformat(),
                "files": [{"path": path, "bytes": len(content), "sha256": hashlib.sha256(content).hexdigest()}
                          for path, content in sorted(files.items())]}
    target = export_path(export)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".zip.partial")
    with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("manifest.json", json.dumps(manifest, indent=2))
        for path, content in sorted(files.items()):
            archive.writestr(path, content)
    os.replace(partial, target)
    digest = hashlib.sha256(target.read_bytes()).hexdigest()
    with transaction.atomic(durable=True):
        changed = TenantExport.objects.filter(pk=export.pk, state=TenantExport.State.PENDING).update(
            state=TenantExport.State.READY, finished_at=now, size_bytes=target.stat().st_size, sha256=digest)
        if changed:
            audit_record(tenant=export.tenant, by=None, action="tenant.export_ready", target=f"export-{export.pk}",
                         data={"files": len(files) + 1, "sha256": digest})
    export.refresh_from_db()
    return export


def tenant_export_archive(*, actor: Actor, pk: int) -> tuple[TenantExport, Path]:
    """A ready export's zip, for its tenant's owners (another tenant's: 404; not ready yet: 409)."""
    export = tenant_export_get(actor=actor, pk=pk)
    if export.state != TenantExport.State.READY:
        raise Conflict(f"Export {export.pk} is {export.state}; it can be downloaded once ready.", field="export")
    path = export_path(export)
    if not path.exists():
        raise Conflict(f"Export {export.pk}'s archive is no longer on this server; request a new export.",
                       field="export")
    return export, path


# -- closure ------------------------------------------------------------------------------------------------------
def _pseudonym(tenant: Tenant, user) -> str:
    return f"closed-{tenant.pk}-{user.pk}"


def tenant_close(*, actor: Actor, confirm: str, now: datetime | None = None) -> Tenant:
    """Close the actor's tenant for good (see the module's docstring). Refused (409, nothing changed) while a
    registered check objects; ``confirm`` must be the tenant's slug (400 naming ``confirm``)."""
    _require_owner(actor, "close the tenant")
    tenant = Tenant.objects.get(pk=actor.tenant.pk)
    if confirm != tenant.slug:
        raise ValidationFailed(f"confirm must be the tenant's slug ('{tenant.slug}') to close it.", field="confirm")
    if tenant.closed_at is not None:
        raise Conflict(f"Tenant '{tenant.slug}' is already closed.", field="tenant")
    for name in sorted(_checks):
        why = _checks[name](tenant)
        if why:
            raise Conflict(f"Tenant '{tenant.slug}' cannot close yet: {why}", field="tenant")
    now = now or timezone.now()
    done: dict = {}
    for name in sorted(_steps):  # each in its own transactions, before the closing one
        done.update(_steps[name](tenant, now))
    with transaction.atomic(durable=True):
        tenant = Tenant.objects.select_for_update().get(pk=tenant.pk)
        if tenant.closed_at is not None:  # a racing closure won
            raise Conflict(f"Tenant '{tenant.slug}' is already closed.", field="tenant")
        memberships = list(Membership.objects.filter(tenant=tenant).select_related("user").order_by("pk"))
        renamed: dict[str, str] = {}
        for membership in memberships:
            user = membership.user
            if Membership.objects.filter(user=user).exclude(tenant=tenant).exists() or user.is_staff:
                continue  # their identity is also another tenant's (or the platform's): they only leave this one
            renamed[user.get_username()] = _pseudonym(tenant, user)
            user.username, user.email = _pseudonym(tenant, user), ""
            for name in ("first_name", "last_name"):
                if hasattr(user, name):
                    setattr(user, name, "")
            user.set_unusable_password()
            user.is_active = False
            user.save()
        ApiToken.objects.filter(tenant=tenant, revoked_at__isnull=True).update(revoked_at=now)
        # nobody signs in to it again: its provider off and its domains free; the links of the people it
        # pseudonymises go with their names
        TenantSignIn.objects.filter(tenant=tenant).update(sso_enabled=False, local_passwords_disabled=False,
                                                          allowed_email_domains=[])
        SsoIdentity.objects.filter(user__in=[m.user for m in memberships if not m.user.is_active]).delete()
        Membership.objects.filter(tenant=tenant).delete()
        Invitation.objects.filter(tenant=tenant).delete()  # usernames it named: personal data, and nothing to join
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL gpubroker.audit_pseudonymise = 'on'")
        for old, new in renamed.items():
            AuditEvent.objects.filter(tenant=tenant, target=old).update(target=new)
        AuditEvent.objects.filter(tenant=tenant, action__startswith="signin.").update(data={})
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL gpubroker.audit_pseudonymise = 'off'")
        Tenant.objects.filter(pk=tenant.pk).update(
            status=TenantStatus.SUSPENDED, closed_at=now, updated_at=now,
            billing_email=f"closed-{tenant.pk}@closed.invalid")
        audit_record(tenant=tenant, by=actor.user, action="tenant.close", target=tenant.slug,
                     data={"members_removed": len(memberships), "users_pseudonymised": len(renamed), **done})
    tenant.refresh_from_db()
    return tenant
