"""The second factor (issue 34 item 2; docs/security.md "Second factor"): TOTP (RFC 6238: an authenticator
app's six digits every 30 s) with single-use recovery codes.

Who needs it: every staff user; every member of a tenant that requires it (``TenantSignIn.totp_required``);
and anyone who enrolled of their own accord. A session that signed in (password or single sign-on) but has not
passed the second factor reaches only the second-factor pages and sign-out (``SecondFactorMiddleware``): pages
redirect to them, the API with that session answers 403 problem+json. API tokens are unaffected (a token is
its own credential, created by a session that passed). The TOTP secret is sealed at rest; a code is accepted
once (``last_timestep``), one step either side of now; a recovery code is stored as SHA-256 only and spent by a
conditional update, so two racing requests cannot both use it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from urllib.parse import quote

import pyotp
from django.db import transaction
from django.db.models import Q
from django.http import HttpResponse, JsonResponse
from django.shortcuts import redirect
from django.urls import reverse
from django.utils import timezone

from core.errors import ApplicationError, Conflict, ValidationFailed
from core.problems import problem_body
from tenants.audit import audit_record
from tenants.models import RecoveryCode, TenantSignIn, TotpDevice
from tenants.sealing import secret_open, secret_seal

SESSION_KEY = "second_factor_user"  # the pk of the user who passed the second factor in this session
ISSUER = "GPU broker"
STEP_SECONDS = 30
RECOVERY_CODE_COUNT = 10
EXEMPT_PREFIXES = ("/accounts/2fa/", "/accounts/logout/", "/accounts/sso/logout", "/static/", "/healthz",
                   "/readyz", "/metrics")


class SecondFactorRefused(ApplicationError):
    status = 403
    code = "second_factor_refused"


# --- selectors ----------------------------------------------------------------------------------


def totp_device_get(*, user) -> TotpDevice | None:
    return TotpDevice.objects.filter(user=user).first()


def second_factor_required(user) -> bool:
    """Staff always; a member of a tenant that requires it."""
    return user.is_staff or TenantSignIn.objects.filter(tenant__memberships__user=user, totp_required=True).exists()


def second_factor_enrolled(user) -> bool:
    return TotpDevice.objects.filter(user=user, confirmed_at__isnull=False).exists()


def second_factor_passed(request) -> bool:
    return request.session.get(SESSION_KEY) == request.user.pk


def second_factor_mark_passed(request) -> None:
    """This session passed the second factor (after ``second_factor_verify`` or ``totp_device_confirm``)."""
    request.session.cycle_key()  # a new session id once the sign-in is complete
    request.session[SESSION_KEY] = request.user.pk


def provisioning_uri(*, user, secret: str) -> str:
    return pyotp.TOTP(secret).provisioning_uri(name=user.get_username(), issuer_name=ISSUER)


# --- services -----------------------------------------------------------------------------------


def _hash_code(code: str) -> str:
    return hashlib.sha256(code.strip().lower().replace("-", "").encode()).hexdigest()


def _recovery_codes_make(user) -> list[str]:
    RecoveryCode.objects.filter(user=user).delete()
    codes = [f"{secrets.token_hex(3)}-{secrets.token_hex(3)}" for _ in range(RECOVERY_CODE_COUNT)]
    RecoveryCode.objects.bulk_create([RecoveryCode(user=user, code_hash=_hash_code(c)) for c in codes])
    return codes


def totp_device_start(*, user) -> str:
    """A new, unconfirmed authenticator secret for the user (replacing an unconfirmed one); returned so the
    set-up page can show it (and its QR code) until it is confirmed. Refused once one is confirmed."""
    with transaction.atomic(durable=True):
        device = TotpDevice.objects.select_for_update().filter(user=user).first()
        if device is not None and device.confirmed_at is not None:
            raise Conflict("An authenticator is already set up for this account.", field="code")
        secret = pyotp.random_base32()
        TotpDevice.objects.update_or_create(user=user, defaults={"secret_sealed": secret_seal(secret),
                                                                 "confirmed_at": None, "last_timestep": 0})
    return secret


def totp_device_setup_secret(*, user) -> str:
    """The secret the set-up page shows: the unconfirmed one being set up, else a new one."""
    device = TotpDevice.objects.filter(user=user, confirmed_at__isnull=True).first()
    return secret_open(device.secret_sealed) if device is not None else totp_device_start(user=user)


def _matching_step(secret: str, code: str, *, after: int, now) -> int | None:
    totp = pyotp.TOTP(secret)
    current = int(now.timestamp()) // STEP_SECONDS
    for step in (current - 1, current, current + 1):
        if step > after and hmac.compare_digest(totp.generate_otp(step), code):
            return step
    return None


def _code(code) -> str:
    code = str(code or "").strip().replace(" ", "")
    if not code:
        raise ValidationFailed("code: enter the six digits your authenticator app shows.", field="code")
    return code


def totp_device_confirm(*, user, code: str) -> list[str]:
    """Confirm the set-up with a code the app shows: the device then counts, and the user gets ten recovery
    codes (returned once; only their hashes are kept). Audited."""
    code = _code(code)
    now = timezone.now()
    with transaction.atomic(durable=True):
        device = TotpDevice.objects.select_for_update().filter(user=user, confirmed_at__isnull=True).first()
        if device is None:
            raise Conflict("There is no authenticator being set up; start again.", field="code")
        step = _matching_step(secret_open(device.secret_sealed), code, after=0, now=now)
        if step is None:
            raise SecondFactorRefused("code: that is not the code your authenticator shows now (check the "
                                      "phone's clock).", field="code")
        TotpDevice.objects.filter(pk=device.pk).update(confirmed_at=now, last_timestep=step)
        codes = _recovery_codes_make(user)
        audit_record(tenant=None, by=user, action="second_factor.enrol", target=user.get_username())
    return codes


def second_factor_verify(*, user, code: str) -> str:
    """Check a TOTP code (each accepted once) or spend a recovery code; says which ("totp", "recovery").
    A recovery code's use is audited."""
    code = _code(code)
    now = timezone.now()
    device = TotpDevice.objects.filter(user=user, confirmed_at__isnull=False).first()
    if device is None:
        raise SecondFactorRefused("This account has no authenticator set up.", field="code")
    if code.isdigit() and len(code) == 6:
        step = _matching_step(secret_open(device.secret_sealed), code, after=device.last_timestep, now=now)
        if step is not None and TotpDevice.objects.filter(pk=device.pk, last_timestep__lt=step).update(
                last_timestep=step) == 1:
            return "totp"
        raise SecondFactorRefused("code: wrong or already used code; wait for the next one.", field="code")
    with transaction.atomic(durable=True):
        spent = RecoveryCode.objects.filter(Q(used_at__isnull=True), user=user, code_hash=_hash_code(code)).update(
            used_at=now)
        if spent != 1:
            raise SecondFactorRefused("code: not a valid recovery code (each works once).", field="code")
        left = RecoveryCode.objects.filter(user=user, used_at__isnull=True).count()
        audit_record(tenant=None, by=user, action="second_factor.recovery_code", target=user.get_username(),
                     data={"left": left})
    return "recovery"


def recovery_codes_regenerate(*, user, factor_passed: bool) -> list[str]:
    """Ten fresh recovery codes, the old ones void: only for a session that has passed the second factor
    (``factor_passed``: ``second_factor_passed(request)``), or a password alone would mint codes that pass it.
    Audited."""
    with transaction.atomic(durable=True):
        if not TotpDevice.objects.filter(user=user, confirmed_at__isnull=False).exists():
            raise Conflict("Set up an authenticator first.", field="code")
        if not factor_passed:
            raise SecondFactorRefused("Pass the second factor first: new recovery codes are for a session that "
                                      "has.", field="code")
        codes = _recovery_codes_make(user)
        audit_record(tenant=None, by=user, action="second_factor.recovery_codes", target=user.get_username())
    return codes


def recovery_codes_left(*, user) -> int:
    return RecoveryCode.objects.filter(user=user, used_at__isnull=True).count()


# --- the gate -----------------------------------------------------------------------------------


class SecondFactorMiddleware:
    """After authentication: a session user who needs a second factor and has not passed it here reaches only
    the second-factor pages, sign-out and the health probes. Requests with an ``Authorization`` header (API
    tokens) pass: the session plays no part in them."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if request.path.startswith(EXEMPT_PREFIXES) or "HTTP_AUTHORIZATION" in request.META:
            return self.get_response(request)  # before the lazy user: the probes never read a session
        user = getattr(request, "user", None)
        if user is None or not user.is_authenticated or second_factor_passed(request):
            return self.get_response(request)
        enrolled = second_factor_enrolled(user)
        if not enrolled and not second_factor_required(user):
            return self.get_response(request)
        if request.path.startswith("/api/"):
            body = problem_body(status=403, title="Second factor required", code="second_factor_required",
                                detail="This session has not passed the second factor: finish signing in at "
                                       f"{reverse('2fa-verify')}, or use an API token.")
            return JsonResponse(body, status=403, content_type="application/problem+json")
        target = f"{reverse('2fa-verify' if enrolled else '2fa-setup')}?next={quote(request.get_full_path())}"
        if request.headers.get("HX-Request"):
            response = HttpResponse(status=204)
            response["HX-Redirect"] = target
            return response
        return redirect(target)



def second_factor_reset(*, user, by) -> None:
    """Take a user's authenticator and recovery codes away (staff, for a lost phone): at the next sign-in they
    set up a new one if they need one. Audited in the staff user's name."""
    with transaction.atomic(durable=True):
        TotpDevice.objects.filter(user=user).delete()
        RecoveryCode.objects.filter(user=user).delete()
        audit_record(tenant=None, by=by, action="second_factor.reset", target=user.get_username())
