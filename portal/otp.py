"""The second-factor pages (``tenants.otp``): set up an authenticator (secret, QR code, otpauth URI; then ten
recovery codes, shown once) and pass the second factor after signing in."""

from __future__ import annotations

import segno
from django.contrib.auth.mixins import LoginRequiredMixin
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views import View

from core.errors import ApplicationError
from tenants.otp import (
    provisioning_uri,
    recovery_codes_left,
    recovery_codes_regenerate,
    second_factor_enrolled,
    second_factor_mark_passed,
    second_factor_passed,
    second_factor_required,
    second_factor_verify,
    totp_device_confirm,
    totp_device_setup_secret,
)


def _next(request) -> str:
    target = request.POST.get("next") or request.GET.get("next") or ""
    if target and url_has_allowed_host_and_scheme(target, {request.get_host()}, request.is_secure()):
        return target
    return "/"


class SecondFactorSetupView(LoginRequiredMixin, View):
    """GET: the secret to add to an authenticator app (QR code and text); POST ``code``: confirm it."""

    def _page(self, request, *, error: str = "", status: int = 200):
        secret = totp_device_setup_secret(user=request.user)
        uri = provisioning_uri(user=request.user, secret=secret)
        return render(request, "registration/2fa_setup.html", {
            "secret": secret, "uri": uri, "qr_src": segno.make(uri, error="m").png_data_uri(scale=4),
            "required": second_factor_required(request.user), "error": error, "next": _next(request)},
            status=status)

    def get(self, request):
        if second_factor_enrolled(request.user):
            return redirect("2fa-verify")
        return self._page(request)

    def post(self, request):
        try:
            codes = totp_device_confirm(user=request.user, code=request.POST.get("code", ""))
        except ApplicationError as error:
            if second_factor_enrolled(request.user):
                return redirect("2fa-verify")
            return self._page(request, error=error.message, status=error.status)
        second_factor_mark_passed(request)
        return render(request, "registration/2fa_recovery_codes.html", {"codes": codes, "next": _next(request)})


class SecondFactorVerifyView(LoginRequiredMixin, View):
    """GET: the code form; POST ``code`` (six digits or a recovery code): this session passes."""

    def get(self, request):
        if not second_factor_enrolled(request.user):
            return redirect("2fa-setup")
        return render(request, "registration/2fa_verify.html", {"next": _next(request)})

    def post(self, request):
        try:
            kind = second_factor_verify(user=request.user, code=request.POST.get("code", ""))
        except ApplicationError as error:
            return render(request, "registration/2fa_verify.html", {"error": error.message, "next": _next(request)},
                          status=error.status)
        second_factor_mark_passed(request)
        if kind == "recovery":
            return render(request, "registration/2fa_recovery_used.html",
                          {"left": recovery_codes_left(user=request.user), "next": _next(request)})
        return redirect(_next(request))


class RecoveryCodesView(LoginRequiredMixin, View):
    """POST: ten new recovery codes (the old ones void), shown once."""

    http_method_names = ["post"]

    def post(self, request):
        try:
            codes = recovery_codes_regenerate(user=request.user, factor_passed=second_factor_passed(request))
        except ApplicationError as error:
            return render(request, "registration/2fa_verify.html", {"error": error.message, "next": "/"},
                          status=error.status)
        return render(request, "registration/2fa_recovery_codes.html", {"codes": codes, "next": "/"})
