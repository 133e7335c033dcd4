"""``python manage.py spend_cap_set TENANT --monthly-minor 100000 [--project SLUG] [--action refuse|warn]``: create
or change the monthly spend cap of a tenant or one of its projects, through ``billing.services`` (validated,
audited as platform staff's change); ``--remove`` deletes it."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from billing import services
from billing.models import SpendCap
from core.errors import ApplicationError
from tenants.models import Project, Tenant


class Command(BaseCommand):
    help = "Create, change or (--remove) the monthly spend cap of a tenant or one of its projects; audited."

    def add_arguments(self, parser):
        parser.add_argument("tenant", help="the tenant's slug")
        parser.add_argument("--project", default="", help="a project's slug (default: the tenant's own cap)")
        parser.add_argument("--monthly-minor", type=int, default=None, help="minor units of the tenant's currency")
        parser.add_argument("--action", default=None, choices=["refuse", "warn"])
        parser.add_argument("--remove", action="store_true")

    def handle(self, *args, tenant, project, monthly_minor, action, remove, **options):
        target = Tenant.objects.filter(slug=tenant).first()
        if target is None:
            raise CommandError("tenant: no such tenant")
        scope = None
        if project:
            scope = Project.objects.filter(tenant=target, slug=project).first()
            if scope is None:
                raise CommandError(f"project: no project {project!r} in tenant {target.slug}")
        cap = SpendCap.objects.filter(tenant=target, project=scope).first()
        where = f"project {scope.slug}" if scope else f"tenant {target.slug}"
        try:
            if remove:
                if cap is None:
                    raise CommandError(f"project: {where} has no spend cap")
                services.spend_cap_delete(cap=cap)
                self.stdout.write(f"{where}: spend cap removed")
                return
            if cap is None:
                if monthly_minor is None:
                    raise CommandError("monthly_minor: required for a new cap (--monthly-minor)")
                cap = services.spend_cap_create(tenant=target, project=scope, monthly_minor=monthly_minor,
                                                action=action or "refuse")
            else:
                cap = services.spend_cap_update(cap=cap, monthly_minor=monthly_minor, action=action)
        except ApplicationError as error:
            raise CommandError(f"{error.field}: {error.message}") from None
        self.stdout.write(f"{where}: {cap.action} past {cap.monthly_minor} minor units of {target.currency} a month")
