"""Create (or reuse) a tenant, a user who is a member of it, and a new API token for scripts.

    python manage.py tenant_bootstrap --tenant acme --user alice --role owner --scopes read,write
    python manage.py tenant_bootstrap --tenant acme --user vera --role viewer     # a read token (by role)

Prints the token once. Running it again reuses the tenant and user and issues another token.
"""

from django.core.management.base import BaseCommand, CommandError

from core.errors import ApplicationError
from tenants import services
from tenants.access import Actor
from tenants.choices import Role, TokenScope
from tenants.models import Membership, Tenant


class Command(BaseCommand):
    help = "Create a tenant, a member and an API token (printed once)."

    def add_arguments(self, parser):
        parser.add_argument("--tenant", required=True, help="tenant slug")
        parser.add_argument("--name", help="tenant display name (default: the slug)")
        parser.add_argument("--billing-email", help="default: billing@<slug>.example")
        parser.add_argument("--currency", default="USD")
        parser.add_argument("--user", required=True, help="username of the member")
        parser.add_argument("--email", default="")
        parser.add_argument("--role", default=Role.OWNER, choices=Role.values)
        parser.add_argument("--scopes", default=None,
                            help="comma-separated: read,write (default by role: read for a viewer, who may not "
                                 "write, read,write otherwise)")
        parser.add_argument("--token-name", default="bootstrap")

    def handle(self, *args, **opts):
        scopes = None
        if opts["scopes"] is not None:
            scopes = [s.strip() for s in opts["scopes"].split(",") if s.strip()]
            bad = [s for s in scopes if s not in TokenScope.values]
            if bad or not scopes:
                raise CommandError(f"--scopes: unknown scope(s) {bad}; use read and/or write")
        try:
            tenant = Tenant.objects.filter(slug=opts["tenant"]).first()
            if tenant is None:
                tenant = services.tenant_create(
                    name=opts["name"] or opts["tenant"], slug=opts["tenant"],
                    billing_email=opts["billing_email"] or f"billing@{opts['tenant']}.example",
                    currency=opts["currency"],
                )
                self.stderr.write(f"created tenant {tenant.slug}")
            user, created = services.user_get_or_create(username=opts["user"], email=opts["email"])
            if created:
                self.stderr.write(f"created user {user.username} (no password; set one with changepassword)")
            membership = Membership.objects.filter(user=user, tenant=tenant).first()
            if membership is None:
                membership = services.membership_add(tenant=tenant, user=user, role=opts["role"])
            actor = Actor(user=user, tenant=tenant, role=Role(membership.role))
            if scopes is None:  # by the member's role: a viewer's token cannot write (api_token_create refuses it)
                scopes = ["read"] if membership.role == Role.VIEWER else ["read", "write"]
            token, secret = services.api_token_create(actor=actor, name=opts["token_name"], scopes=scopes)
        except ApplicationError as exc:
            raise CommandError(f"{exc.field or 'error'}: {exc.message}") from exc
        self.stderr.write(f"token {token.prefix} for {user.username} in {tenant.slug} ({membership.role}, "
                          f"scopes {','.join(token.scopes)}); it is shown once:")
        self.stdout.write(secret)
