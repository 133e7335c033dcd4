"""Sign-in pages of single sign-on (``tenants.sso``): the password form that honours a tenant's switch-off of
local passwords, "Sign in with <provider>" found by tenant slug or e-mail domain, the callback and sign-out.

The request step is mozilla-django-oidc's view (state, nonce and PKCE kept in the session under
``oidc_states``) given the tenant's provider instead of global settings; the callback is ours, so every refusal
renders a page that says why (the library's answers a bare 400 or a redirect)."""

from __future__ import annotations

import logging
from urllib.parse import parse_qs, urlencode, urlsplit

from django import forms
from django.contrib import auth, messages
from django.contrib.auth import views as auth_views
from django.contrib.auth.forms import AuthenticationForm
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views import View
from mozilla_django_oidc.views import OIDCAuthenticationRequestView

from core.errors import ApplicationError
from portal.forms import FieldErrors
from portal.views import TenantView
from tenants.choices import Role
from tenants.selectors import SESSION_TENANT_KEY
from tenants.sso import (
    BACKEND_PATH,
    SIGN_IN_FIELDS,
    SsoRefused,
    TenantOIDCBackend,
    group_projects_slugs,
    password_sign_in_refusal,
    provider_metadata,
    sign_in_find,
    sign_in_get,
    sign_in_update,
)

log = logging.getLogger(__name__)


class PasswordSignInForm(AuthenticationForm):
    """Django's sign-in form, refusing (after the right password only: no account enumeration) a member of a
    tenant that turned local passwords off."""

    def confirm_login_allowed(self, user):
        super().confirm_login_allowed(user)
        refusal = password_sign_in_refusal(user)
        if refusal:
            raise forms.ValidationError(refusal, code="sso_only")


class SignInView(auth_views.LoginView):
    """The sign-in page: a password form, and "Sign in with <provider>" for ``?org=<slug or e-mail domain>``."""

    authentication_form = PasswordSignInForm
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        org = self.request.GET.get("org", "")[:254]
        context["sso_org"] = org
        context["sso"] = sign_in_find(query=org) if org else None
        return context


def _refused(request, message: str, status: int):
    return render(request, "registration/sso_refused.html", {"message": message}, status=status)


class SsoStartView(OIDCAuthenticationRequestView):
    """GET ``?org=<tenant slug, e-mail address or domain>``: off to that tenant's provider."""

    def __init__(self, *args, **kwargs):
        View.__init__(self, *args, **kwargs)  # the library's reads global OIDC_* settings; ours are per tenant

    def get(self, request):
        org = request.GET.get("org", "")[:254]
        sign_in = sign_in_find(query=org)
        if sign_in is None:
            return _refused(request, f"No tenant signs in with single sign-on under '{org}'. Check the "
                                     "organisation's name or your e-mail address, or sign in with a password.", 404)
        try:
            metadata = provider_metadata(sign_in.issuer)
        except SsoRefused as error:
            return _refused(request, error.message, error.status)
        self.OIDC_OP_AUTH_ENDPOINT = metadata["authorization_endpoint"]
        self.OIDC_RP_CLIENT_ID = sign_in.client_id
        response = super().get(request)
        state = parse_qs(urlsplit(response["Location"]).query)["state"][0]
        request.session["oidc_states"][state]["tenant"] = sign_in.tenant_id
        request.session.modified = True
        return response


class SsoCallbackView(View):
    """GET ``?code&state`` from the provider. The state is spent before anything else (a replayed or foreign
    state finds nothing), then ``TenantOIDCBackend`` checks the tokens and signs the member in."""

    def get(self, request):
        state = request.GET.get("state", "")
        states = request.session.get("oidc_states", {})
        entry = states.pop(state, None) if state else None
        request.session.modified = True
        if entry is None or "tenant" not in entry:
            return _refused(request, "This sign-in answer was already used or was not started in this browser "
                                     "(unknown state); start again from the sign-in page.", 400)
        if request.GET.get("error"):
            return _refused(request, "The identity provider refused the sign-in: "
                                     f"{request.GET.get('error_description') or request.GET['error']}.", 403)
        if not request.GET.get("code"):
            return _refused(request, "The identity provider's answer has no code; start again.", 400)
        request.session.save()  # the state is spent even if what follows fails
        try:
            user = TenantOIDCBackend().authenticate(request, sso_tenant_id=entry["tenant"], nonce=entry["nonce"],
                                                    code_verifier=entry.get("code_verifier"))
        except ApplicationError as error:
            log.warning("single sign-on refused: %s", error.message, extra={"tenant_id": entry["tenant"]})
            return _refused(request, error.message, error.status)
        if user is None or not user.is_active:
            return _refused(request, "This account is disabled; ask the platform's staff.", 403)
        id_token = request.session.get("oidc_id_token")
        auth.login(request, user, backend=BACKEND_PATH)
        request.session["oidc_id_token"] = id_token
        request.session["oidc_tenant_id"] = entry["tenant"]
        from tenants.models import Tenant

        request.session[SESSION_TENANT_KEY] = Tenant.objects.get(pk=entry["tenant"]).slug
        next_url = request.session.pop("oidc_login_next", None)
        if next_url and url_has_allowed_host_and_scheme(next_url, {request.get_host()}, request.is_secure()):
            return redirect(next_url)
        return redirect("portal:dashboard")


class SsoLogoutView(View):
    """POST: sign out here, then at the tenant's provider (RP-initiated logout, with the ID token as hint) when
    the provider offers it; else back to the sign-in page."""

    http_method_names = ["post"]

    def post(self, request):
        from tenants.models import TenantSignIn

        id_token = request.session.get("oidc_id_token")
        sign_in = TenantSignIn.objects.filter(tenant_id=request.session.get("oidc_tenant_id"),
                                              sso_enabled=True).first()
        auth.logout(request)
        target = reverse("login")
        if sign_in is not None and id_token:
            try:
                end_session = provider_metadata(sign_in.issuer).get("end_session_endpoint")
            except SsoRefused:
                end_session = None
            if end_session:
                target = f"{end_session}?{urlencode({'id_token_hint': id_token, 'client_id': sign_in.client_id})}"
        return redirect(target)


class SignInSettingsView(TenantView):
    """The tenant's sign-in settings (owners change them; everyone of the tenant reads them): single sign-on,
    local passwords, the second factor. The client secret is write-only: left empty, it keeps its value."""

    template_name = "portal/settings_sign_in.html"
    write_action = "own"

    def render_page(self, request, *, errors=None, values=None, status=200):
        sign_in = sign_in_get(tenant=self.actor.tenant)
        context = {"sign_in": sign_in, "can_own": self.actor.can("own"), "roles": Role.choices,
                   "default_roles": [(v, label) for v, label in Role.choices if v != Role.OWNER],
                   "callback_url": request.build_absolute_uri(reverse("sso-callback")),
                   "group_roles_text": "\n".join(f"{g}={r}" for g, r in sorted(sign_in.group_roles.items())),
                   "group_projects_text": "\n".join(f"{g}={' '.join(slugs)}"
                                                    for g, slugs in group_projects_slugs(sign_in).items()),
                   "errors": errors or FieldErrors(), "values": values, "tab": "sign-in"}
        return render(request, self.template_name, context, status=status)

    def get(self, request):
        return self.render_page(request)

    def post(self, request):
        data = request.POST
        group_roles = {}
        for line in data.get("group_roles", "").splitlines():
            if line.strip():
                group, _, role = line.partition("=")
                group_roles[group.strip()] = role.strip()
        group_projects = {}
        for line in data.get("group_projects", "").splitlines():
            if line.strip():
                group, _, slugs = line.partition("=")
                group_projects[group.strip()] = slugs.replace(",", " ").split()
        changes = {
            "sso_enabled": data.get("sso_enabled") == "on", "provider_name": data.get("provider_name", ""),
            "issuer": data.get("issuer", ""), "client_id": data.get("client_id", ""),
            "allowed_email_domains": [d for d in data.get("allowed_email_domains", "").replace(",", " ").split()],
            "default_role": data.get("default_role", ""), "group_roles": group_roles,
            "group_projects": group_projects,
            "local_passwords_disabled": data.get("local_passwords_disabled") == "on",
            "totp_required": data.get("totp_required") == "on"}
        if data.get("client_secret"):
            changes["client_secret"] = data["client_secret"]
        try:
            sign_in_update(tenant=self.actor.tenant, by=self.actor, changes=changes)
        except ApplicationError as error:
            return self.render_page(request, errors=FieldErrors(error, shown=set(SIGN_IN_FIELDS)), values=data,
                                    status=error.status)
        messages.success(request, "Sign-in settings saved.")
        return redirect("portal-sign-in")
