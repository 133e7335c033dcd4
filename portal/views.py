"""Portal pages of a tenant. Views are thin: they read through the same tenant-scoped selectors as the API
(``tenants.access.restrict`` underneath, so another tenant's objects are simply not found), write through
one service each, and render. Live parts are partials returned when htmx asks (``request.htmx``)."""

from __future__ import annotations

import shlex
import uuid

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.mixins import LoginRequiredMixin
from django.core.paginator import Paginator
from django.http import HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views import View

from billing.selectors import quotes
from billing.selectors.balances import credit_balance
from broker import selectors as broker
from broker import services as broker_services
from broker.choices import FINAL_STATES, HOLDING_STATES, LeaseState, WorkloadClass
from capacity.presenters import advice_panel
from core.errors import ApplicationError, NotFound, PermissionDenied, TenantSuspended, ValidationFailed
from core.parsers import MAX_ID, parse_integer
from portal import forms, presenters
from portal.pricing import dashboard_alerts, dashboard_spend
from tenants import selectors, services, ssh_keys
from tenants.choices import PROJECT_LIMITABLE_ROLES, Role, TokenScope
from tenants.permissions import SAFE_METHODS
from tiering import selectors as tiering_selectors

STATE_GROUPS = {
    "live": ",".join(s for s in LeaseState.values if s not in FINAL_STATES),
    "active": ",".join(HOLDING_STATES),
    "waiting": f"{LeaseState.REQUESTED},{LeaseState.QUEUED}",
    "finished": ",".join(FINAL_STATES),
    "all": "",
}
STATE_GROUP_LABELS = (("live", "Live (not finished)"), ("active", "On GPUs"), ("waiting", "Waiting"),
                      ("finished", "Finished"), ("all", "All"))


def error_page(request, status: int, message: str) -> HttpResponse:
    template = {403: "403.html", 404: "404.html"}.get(status, "400.html")
    return render(request, template, {"message": message}, status=status)


class PortalView(LoginRequiredMixin, View):
    """Login required; application errors the view does not handle itself become their page (404 for
    what the actor's tenant does not hold, 403 for what the role does not allow, 400 for a query parameter
    that is not what the page reads, e.g. ``?placement=²``)."""

    def dispatch(self, request, *args, **kwargs):
        try:
            return super().dispatch(request, *args, **kwargs)
        except NotFound as error:
            return error_page(request, 404, error.message)
        except (PermissionDenied, TenantSuspended) as error:
            return error_page(request, 403, error.message)
        except ValidationFailed as error:  # its status: 400, or a subclass's (402 over a spend cap)
            return error_page(request, error.status, error.message)

    def handle_no_permission(self):
        if self.request.user.is_authenticated:
            return error_page(self.request, 403, "This page is for platform staff.")
        if getattr(self.request, "htmx", False):  # a live part polling after the session ended: go to login
            response = HttpResponse(status=204)
            response["HX-Redirect"] = f"{reverse('login')}?next={self.request.get_full_path()}"
            return response
        return super().handle_no_permission()


class TenantView(PortalView):
    """A page of the acting tenant (``self.actor``); users without a tenant see why.

    The portal's half of the one permission rule (the API's is ``tenants.permissions``): a GET needs
    ``view``; any other method is a write and needs the view's ``write_action`` (default ``manage``, or
    ``required_action(request)``), checked here before the handler runs, so a view cannot forget it.
    The services check their finer rules again."""

    write_action = "manage"

    def required_action(self, request) -> str:
        return "view" if request.method in SAFE_METHODS else self.write_action

    def dispatch(self, request, *args, **kwargs):
        if request.user.is_authenticated:
            self.actor = selectors.actor_for_request(request)
            if self.actor is None:
                if request.user.is_staff:
                    return redirect("portal:fleet")
                return render(request, "portal/no_tenant.html", status=403)
            handler = getattr(self, request.method.lower(), None)
            if request.method.lower() in self.http_method_names and handler is not None:
                try:
                    self.actor.require(self.required_action(request))
                except (PermissionDenied, TenantSuspended) as error:
                    return error_page(request, 403, error.message)
        return super().dispatch(request, *args, **kwargs)

    def actor_label(self) -> str:
        return f"user:{self.request.user.get_username()}"


# -- dashboard -------------------------------------------------------------------------------------------
class DashboardView(TenantView):
    template_name = "portal/dashboard.html"

    def get(self, request):
        actor = self.actor
        leases = {
            "active": list(broker.lease_list(actor=actor, state=STATE_GROUPS["active"])[:20]),
            "waiting": list(broker.lease_list(actor=actor, state=STATE_GROUPS["waiting"])[:20]),
        }
        if request.htmx:
            return render(request, "portal/partials/_dashboard_leases.html", {"leases": leases})
        usage = broker.quota_usage(actor=actor)
        quotas = list(selectors.quota_list(actor=actor))
        projects = [(project, presenters.quota_bars([q for q in quotas if q.project_id == project.pk], usage,
                                                    project_id=project.pk, with_weight=True))
                    for project in selectors.project_list(actor=actor)]
        context = {
            "tenant": actor.tenant,
            "tenant_bars": presenters.quota_bars(selectors.tenant_quota_list(actor=actor), usage),
            "projects": projects,
            "leases": leases,
            "can_use": actor.can("use"),
            "invitations_waiting": selectors.invitations_for_user(user=request.user).count(),
            "spend": dashboard_spend(actor),
            "advice": advice_panel(actor=actor),
            "credit": credit_balance(actor=actor, now=timezone.now()),
            "spend_alerts": dashboard_alerts(actor),
        }
        return render(request, self.template_name, context)


class TenantSwitchView(LoginRequiredMixin, View):
    """Choose which of the user's tenants the portal shows (POST, CSRF-protected)."""

    def post(self, request):
        slug = request.POST.get("tenant", "")
        if not selectors.membership_list_for_user(user=request.user).filter(tenant__slug=slug).exists():
            messages.error(request, "You are not a member of that tenant.")
        else:
            request.session[selectors.SESSION_TENANT_KEY] = slug
        return redirect("portal:dashboard")


# -- leases ----------------------------------------------------------------------------------------------
class LeaseListView(TenantView):
    template_name = "portal/lease_list.html"

    def get(self, request):
        group = request.GET.get("state", "live")
        if group not in STATE_GROUPS:
            group = "live"
        project = request.GET.get("project", "")
        leases = broker.lease_list(actor=self.actor, state=STATE_GROUPS[group], project=project)
        page = Paginator(leases, 25).get_page(request.GET.get("page"))
        context = {"page": page, "group": group, "project": project, "groups": STATE_GROUP_LABELS,
                   "projects": selectors.project_list(actor=self.actor), "can_use": self.actor.can("use"),
                   "query": request.GET.urlencode()}
        if request.htmx and request.htmx.target == "lease-table":
            return render(request, "portal/partials/_lease_table.html", context)
        return render(request, self.template_name, context)


class LeaseRequestView(TenantView):
    """The request form. Without JavaScript it posts and redirects (or shows the errors next to their
    fields); with htmx the preview beside it follows every change."""

    template_name = "portal/lease_request.html"
    write_action = "use"

    def required_action(self, request) -> str:
        if request.method == "POST" and "preview" in request.POST:
            return "view"  # the no-JS preview button: a dry run, nothing is written
        return super().required_action(request)

    def context(self, data=None, errors=None, preview=None, idempotency_key=None) -> dict:
        projects = list(selectors.project_list(actor=self.actor))
        tiers = [q.tier for q in selectors.tenant_quota_list(actor=self.actor)]
        values = data or {}
        return {
            "projects": projects,
            "models": presenters.model_options(tiers),
            "profile_groups": presenters.mig_profile_groups(tiers),
            "workloads": [w.name for w in tiering_selectors.workload_list(actor=self.actor)],
            "classes": WorkloadClass.choices,
            "restart_policies": forms.RESTART_POLICIES,
            "workload_open": forms.workload_given(values, errors or {}),
            # a workload's paths lie under <root>/<tenant>/<project> (docs/leasing.md, "Workloads")
            "workload_root": f"{(settings.WORKLOAD_ALLOWED_ROOTS or [''])[0]}/{self.actor.tenant.slug}/<project>",
            "durations": forms.DURATIONS,
            "values": values,
            "kind": values.get("gpu.kind", "mig"),
            "gang": forms.last_value(values, "gpu.gang", "true") == "true" if values else True,
            "errors": errors or forms.FieldErrors(),
            "preview": preview,
            "can_use": self.actor.can("use"),
            "denied": None if self.actor.can("use") else _denial(self.actor, "use"),
            "idempotency_key": idempotency_key or uuid.uuid4().hex,
            "label_keys": self.actor.tenant.allowed_label_keys,
        }

    def get(self, request):
        return render(request, self.template_name, self.context())

    def post(self, request):
        key = request.POST.get("idempotency_key", "")[:200]
        if "preview" in request.POST:  # the no-JS preview button
            preview = _preview(self.actor, request.POST)
            return render(request, self.template_name, self.context(request.POST, preview=preview,
                                                                    idempotency_key=key))
        try:
            body = forms.lease_request_input(request.POST)  # a workload line that is no words names its field
            lease, created = broker_services.lease_request(actor=self.actor, idempotency_key=key, **body)
        except ApplicationError as error:
            if error.field == "Idempotency-Key":  # the form was sent before with other values
                error.field, key = None, ""
                error.message = "This form was already submitted with other values; check them and send again."
            errors = forms.lease_field_errors(error)
            # the API's status where it says more than "fix the form": refused by role/suspension, or by budget
            status = 403 if isinstance(error, PermissionDenied | TenantSuspended) else \
                402 if error.status == 402 else 400
            return render(request, self.template_name, self.context(request.POST, errors=errors,
                                                                    idempotency_key=key), status=status)
        if created:
            messages.success(request, f"Lease {lease.pk} requested: it is in the queue and starts as soon as it "
                                      f"fits.")
        return redirect("portal:lease", pk=lease.pk)


def _denial(actor, action: str) -> str:
    try:
        actor.require(action)
    except ApplicationError as error:
        return error.message
    return ""


def _preview(actor, data) -> dict:
    """The preview panel's content: the quote — ``billing.selectors.quotes.lease_quote``, the function that answers
    ``POST /api/v1/quotes``, so the portal and the API say the same — or the error in the API's words."""
    try:
        return {"quote": quotes.lease_quote(actor=actor, **forms.lease_request_input(data))}
    except ApplicationError as error:
        return {"error": error.message, "field": error.field}


class LeasePreviewView(TenantView):
    """``GET /leases/preview?<the form>``: the partial the request form shows live. Writes nothing."""

    def get(self, request):
        preview = _preview(self.actor, request.GET)
        return render(request, "portal/partials/_preview.html", {"preview": preview})


class LeaseDetailView(TenantView):
    template_name = "portal/lease_detail.html"

    def context(self, lease, **extra) -> dict:
        now = timezone.now()
        workload = presenters.lease_workload(lease)
        series = broker.lease_utilisation(lease=lease, now=now) if lease.active_at else []
        devices = [a for a in lease.allocations.all() if a.freed_at is None]
        return {
            "lease": lease,
            "shape": presenters.shape_label(lease),
            "devices": devices,
            "share_enforcement": broker.share_enforcement_of(devices),
            "access": broker.lease_access(lease=lease) if lease.state in ("active", "preempted") else [],
            # within LEASE_EXPIRING_NOTICE_SECONDS of its end: the page says so, as the lease.expiring event does
            "expiring_in": presenters.expiring_in_seconds(lease, now),
            "events": list(lease.events.all()),
            "sparkline": presenters.Sparkline(series) if series else None,
            "workload": workload,
            "workload_line": shlex.join(workload.spec.get("command", []) + workload.spec.get("args", []))
            if workload else "",
            "placements": broker_services.workload_placements(lease=lease) if workload else [],
            "telemetry_down": series is None,
            "poll": presenters.poll_seconds(lease),
            "can_use": self.actor.can("use"),
            "can_release": self.actor.can("release"),
            "live": presenters.is_live(lease),
            "durations": forms.DURATIONS,
            "now": now,
            **extra,
        }

    def get(self, request, pk: int):
        lease = broker.lease_get(actor=self.actor, lease_id=pk)
        context = self.context(lease)
        if request.htmx and request.htmx.target == "lease-live":
            # the actions change only with the state: sent along (out of band) when the state moved
            context["actions_oob"] = request.GET.get("shown") != lease.state
            return render(request, "portal/partials/_lease_live.html", context)
        return render(request, self.template_name, context)


class LeaseLogView(TenantView):
    """``GET /leases/<id>/log?stream=stdout|stderr[&placement=N]``: the partial with the tail of the lease's
    workload log (the last ``LOG_TAIL`` bytes of its current placement, read from its node, or of an earlier
    placement ``N``, as the broker kept it when that placement ended: ``broker.services.workload_logs``); the
    lease page polls the current placement's while the lease lives. The lease is looked up among the acting
    tenant's own first, so another tenant's lease is 404 before a byte is read."""

    LOG_TAIL = 16 * 1024

    def get(self, request, pk: int):
        from agent.protocol import AgentHTTPError, AgentUnreachable

        lease = broker.lease_get(actor=self.actor, lease_id=pk)
        workload = presenters.lease_workload(lease)
        if workload is None:
            raise NotFound("This lease has no workload.", field="id")
        stream = "stderr" if request.GET.get("stream") == "stderr" else "stdout"
        placements = broker_services.workload_placements(lease=lease)
        chosen = request.GET.get("placement", "")
        placement = parse_integer(chosen, field="placement", low=1, high=MAX_ID) if chosen else None
        if placement is not None and placement >= workload.placements:  # the current one: read from its node
            placement = None
        log, unavailable = None, ""
        try:
            log = broker_services.workload_logs(lease=lease, stream=stream, tail=self.LOG_TAIL, placement=placement)
        except NotFound as error:
            unavailable = error.message
        except (AgentUnreachable, AgentHTTPError):
            unavailable = "The workload's node does not answer right now; the log appears here when it does."
        return render(request, "portal/partials/_workload_log.html", {
            "lease": lease, "workload": workload, "log": log, "stream": stream, "unavailable": unavailable,
            "placements": placements if len(placements) > 1 else [], "placement": placement,
            "poll": presenters.poll_seconds(lease) and placement is None and 3, "tail": self.LOG_TAIL})


class LeaseReleaseView(LeaseDetailView):
    http_method_names = ["post"]
    write_action = "release"  # allowed while the tenant is suspended: giving back stops the meter

    def post(self, request, pk: int):
        lease = broker.lease_get(actor=self.actor, lease_id=pk)
        try:
            lease = broker_services.lease_release(lease=lease, actor=self.actor_label())
        except ApplicationError as error:
            messages.error(request, error.message)
        else:
            # while it is being released the live part of the page says so and turns to finished by itself;
            # a flash message saying "being released" would outlive it
            if lease.state in FINAL_STATES:
                messages.success(request, f"Lease {lease.pk} released.")
        return redirect("portal:lease", pk=pk)


class LeaseRenewView(LeaseDetailView):
    http_method_names = ["post"]
    write_action = "use"

    def post(self, request, pk: int):
        lease = broker.lease_get(actor=self.actor, lease_id=pk)
        try:
            lease = broker_services.lease_renew(lease=lease, actor=self.actor_label(),
                                                 duration_seconds=forms.number(request.POST.get("duration_seconds")))
        except ApplicationError as error:
            lease = broker.lease_get(actor=self.actor, lease_id=pk)
            context = self.context(lease, renew_error=error.message,
                                   renew_value=request.POST.get("duration_seconds", ""))
            return render(request, self.template_name, context, status=error.status)
        messages.success(request, f"Lease {lease.pk} renewed until {lease.ends_at:%Y-%m-%d %H:%M} UTC.")
        return redirect("portal:lease", pk=pk)


# -- settings: members -------------------------------------------------------------------------------------
class MembersView(TenantView):
    template_name = "portal/settings_members.html"

    def render_page(self, request, *, errors=None, form="", values=None, status=200):
        actor = self.actor
        roles = [(value, label) for value, label in Role.choices if value != Role.OWNER or actor.can("own")]
        projects = list(selectors.project_list(actor=actor).values_list("pk", "slug"))
        slugs = dict(projects)
        members = list(selectors.membership_list(actor=actor))
        for member in members:  # None: every project; else the slugs it is limited to (a deleted one drops out)
            member.project_slugs = (None if member.project_ids is None
                                    else [slugs[pk] for pk in member.project_ids if pk in slugs])
            member.limitable = member.role in PROJECT_LIMITABLE_ROLES
        context = {
            "members": members,
            "projects": [slug for _, slug in projects],
            "roles": roles,
            "all_roles": Role.choices,
            "can_manage": actor.can("manage"),
            "can_own": actor.can("own"),
            "errors": errors or forms.FieldErrors(),
            "form": form,
            "values": values or {},
            "tab": "members",
            "invitations": list(selectors.invitation_list(actor=actor)) if actor.can("manage") else [],
        }
        return render(request, self.template_name, context, status=status)

    def get(self, request):
        return self.render_page(request)


class MemberInviteView(MembersView):
    def post(self, request):
        try:
            invitation = services.membership_invite(actor=self.actor, username=request.POST.get("username", ""),
                                                    role=request.POST.get("role", ""))
        except ApplicationError as error:
            return self.render_page(request, errors=forms.FieldErrors(error, shown={"username", "role"}),
                                    form="invite", values=request.POST, status=error.status)
        messages.success(request, f"Invitation for {invitation.username} as {invitation.role} recorded: they join "
                                  f"{self.actor.tenant.name} when they accept it (under Invitations, once signed in).")
        return redirect("portal:members")


class InvitationRevokeView(MembersView):
    def post(self, request, pk: int):
        invitation = selectors.invitation_get(actor=self.actor, pk=pk)
        try:
            services.invitation_revoke(actor=self.actor, invitation=invitation)
        except ApplicationError as error:
            messages.error(request, error.message)
        else:
            messages.success(request, f"The invitation for {invitation.username} is revoked.")
        return redirect("portal:members")


class InvitationsView(PortalView):
    """The signed-in user's own pending invitations, any tenant's, to accept or decline (a user of no tenant yet
    comes here from the "No tenant yet" page)."""

    template_name = "portal/invitations.html"

    def get(self, request):
        return render(request, self.template_name,
                      {"invitations": list(selectors.invitations_for_user(user=request.user))})


class InvitationDecideView(PortalView):
    decision = "accept"

    def post(self, request, pk: int):
        invitation = selectors.invitation_for_user(user=request.user, pk=pk)
        try:
            services.invitation_decide(user=request.user, invitation=invitation, accept=self.decision == "accept")
        except ApplicationError as error:
            messages.error(request, error.message)
            return redirect("portal:invitations")
        if self.decision == "accept":
            request.session[selectors.SESSION_TENANT_KEY] = invitation.tenant.slug
            messages.success(request, f"You are now a {invitation.role} of {invitation.tenant.name}.")
            return redirect("portal:dashboard")
        messages.success(request, f"You declined the invitation to {invitation.tenant.name}.")
        return redirect("portal:invitations")


class MemberRoleView(MembersView):
    def post(self, request, pk: int):
        membership = selectors.membership_get(actor=self.actor, pk=pk)
        try:
            membership = services.membership_change_role(actor=self.actor, membership=membership,
                                                         role=request.POST.get("role", ""))
        except ApplicationError as error:
            return self.render_page(request, errors=forms.FieldErrors(error, shown=set()), form="member",
                                    status=error.status)
        messages.success(request, f"{membership.user.get_username()} is now a {membership.role}.")
        return redirect("portal:members")


class MemberProjectsView(MembersView):
    """Limit a member or viewer to some projects, or give them every project back."""

    def post(self, request, pk: int):
        membership = selectors.membership_get(actor=self.actor, pk=pk)
        projects = None if request.POST.get("scope") == "all" else request.POST.getlist("projects")
        try:
            membership = services.membership_set_projects(actor=self.actor, membership=membership, projects=projects)
        except ApplicationError as error:
            return self.render_page(request, errors=forms.FieldErrors(error, shown=set()), form="member",
                                    status=error.status)
        reach = ("every project" if membership.project_ids is None
                 else ", ".join(projects) if projects else "no project yet")
        messages.success(request, f"{membership.user.get_username()} now reaches {reach}.")
        return redirect("portal:members")


class MemberRemoveView(MembersView):
    write_action = "leave"  # leaving oneself; removing others needs `revoke` (the service)

    def post(self, request, pk: int):
        membership = selectors.membership_get(actor=self.actor, pk=pk)
        try:
            services.membership_remove(actor=self.actor, membership=membership)
        except ApplicationError as error:
            return self.render_page(request, errors=forms.FieldErrors(error, shown=set()), form="member",
                                    status=error.status)
        if membership.user_id == request.user.pk:
            request.session.pop(selectors.SESSION_TENANT_KEY, None)
            messages.success(request, f"You left {self.actor.tenant.name}.")
            return redirect("portal:dashboard")
        messages.success(request, f"{membership.user.get_username()} was removed; their API tokens are revoked.")
        return redirect("portal:members")


# -- settings: API tokens ----------------------------------------------------------------------------------
class TokensView(TenantView):
    template_name = "portal/settings_tokens.html"
    write_action = "self"  # one's own tokens (not while suspended); the service caps the scopes by role

    def render_page(self, request, *, errors=None, values=None, status=200):
        projects = list(selectors.project_list(actor=self.actor))
        context = {
            "tokens": presenters.token_rows(selectors.api_token_list(actor=self.actor), projects),
            "projects": projects,
            "chosen_projects": values.getlist("projects") if values else [],
            "can_manage": self.actor.can("manage"),
            "can_write": self.actor.can("use"),
            "scopes": TokenScope.choices,
            "lifetimes": forms.TOKEN_LIFETIMES,
            "errors": errors or forms.FieldErrors(),
            "values": values,
            "chosen_scopes": values.getlist("scopes") if values else ["read"],
            "tab": "tokens",
            "now": timezone.now(),
        }
        return render(request, self.template_name, context, status=status)

    def get(self, request):
        return self.render_page(request)

    def post(self, request):
        now = timezone.now()
        try:
            token, secret = services.api_token_create(actor=self.actor, now=now,
                                                      **forms.token_create_input(request.POST, now=now))
        except ApplicationError as error:
            return self.render_page(request, errors=forms.FieldErrors(error, shown={"name", "scopes", "expires_at",
                                                                                "projects"}),
                                    values=request.POST, status=error.status)
        # the secret is in this response only: never stored, never cached, not in a redirect
        response = render(request, "portal/token_created.html", {"token": token, "secret": secret, "tab": "tokens"},
                          status=201)
        response["Cache-Control"] = "no-store"
        return response


class SshKeysView(TenantView):
    """Your SSH public keys, for ``ssh -p <port> lease-<id>@<broker>`` (docs/leasing.md, "SSH")."""

    template_name = "portal/settings_ssh_keys.html"
    write_action = "self"  # one's own credential (not while suspended)

    def render_page(self, request, *, errors=None, values=None, status=200):
        context = {"keys": ssh_keys.ssh_key_list(actor=self.actor), "errors": errors or forms.FieldErrors(),
                   "values": values, "tab": "ssh-keys", "gateway": broker.ssh_gateway_address()}
        return render(request, self.template_name, context, status=status)

    def get(self, request):
        return self.render_page(request)

    def post(self, request):
        try:
            key = ssh_keys.ssh_key_add(actor=self.actor, name=request.POST.get("name", ""),
                                       public_key=request.POST.get("public_key", ""))
        except ApplicationError as error:
            values = request.POST.copy()
            if "PRIVATE KEY" in values.get("public_key", ""):
                values["public_key"] = ""  # a private key pasted by mistake is never shown back
            return self.render_page(request, errors=forms.FieldErrors(error, shown={"name", "public_key"}),
                                    values=values, status=error.status)
        messages.success(request, f"SSH key {key.name} added ({key.fingerprint}).")
        return redirect("portal:ssh-keys")


class ProjectPoolsView(TenantView):
    """``/settings/pools``: the node pools each project's leases are placed in (docs/scheduling.md, "Cohorts, node
    pools and minimum runtime"), and the tenant's cohort. Everyone in the tenant reads; admins and owners bind a
    project (``manage``). ``POST`` (``project``, ``pools``: the pools checked, none for any pool) through
    ``project_update``; a refusal is shown on the page with nothing written."""

    template_name = "portal/settings_pools.html"
    write_action = "manage"

    def render_page(self, request, *, error=None, status=200):
        context = {"projects": selectors.project_list(actor=self.actor), "fleet_pools": broker.node_pool_names(),
                   "cohort": self.actor.tenant.cohort.name if self.actor.tenant.cohort_id else None,
                   "can_manage": self.actor.can("manage"), "error": error, "tab": "pools"}
        context["fleet_pools"] = sorted(context["fleet_pools"])
        return render(request, self.template_name, context, status=status)

    def get(self, request):
        return self.render_page(request)

    def post(self, request):
        project = selectors.project_get(actor=self.actor, slug=request.POST.get("project", ""))
        try:
            project = services.project_update(actor=self.actor, project=project, pools=request.POST.getlist("pools"))
        except ApplicationError as error:
            return self.render_page(request, error=error.message, status=error.status)
        messages.success(request, f"Project {project.slug}: placed in "
                                  + (f"pool(s) {', '.join(project.pools)}." if project.pools else "any pool."))
        return redirect("portal:pools")


class SshKeyRemoveView(TenantView):
    http_method_names = ["post"]
    write_action = "leave"

    def post(self, request, pk: int):
        key = ssh_keys.ssh_key_get(actor=self.actor, pk=pk)
        try:
            ssh_keys.ssh_key_remove(actor=self.actor, key=key)
        except ApplicationError as error:
            messages.error(request, error.message)
        else:
            messages.success(request, f"SSH key {key.name} removed: it opens no new session.")
        return redirect("portal:ssh-keys")


class TokenRevokeView(TenantView):
    http_method_names = ["post"]
    write_action = "leave"  # one's own token; others' need `revoke` (the service)

    def post(self, request, pk: int):
        token = selectors.api_token_get(actor=self.actor, pk=pk)
        try:
            token = services.api_token_revoke(actor=self.actor, token=token)
        except ApplicationError as error:
            messages.error(request, error.message)
        else:
            messages.success(request, f"Token {token.prefix} ({token.name}) revoked: it stops working now.")
        return redirect("portal:tokens")
