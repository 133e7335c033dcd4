"""Sign-in pages beside Django's login view: asking for and following an unlock link (``tenants.lockout``)."""

from __future__ import annotations

from django.shortcuts import redirect, render
from django.urls import reverse
from django.views import View

from core.errors import ApplicationError
from tenants.lockout import login_unlock_cookie_set, login_unlock_redeem, login_unlock_send
from tenants.throttling import client_ip


class LoginUnlockRequestView(View):
    """POST a username: mails that account an unlock link. The answer is the same whether or not the account
    exists, has an e-mail address or was mailed a moment ago (no enumeration, no mailbox flooding)."""

    def post(self, request):
        username = request.POST.get("username", "")[:150]
        if username:
            login_unlock_send(username=username, link_for=lambda token: request.build_absolute_uri(
                reverse("login-unlock", kwargs={"token": token})))
        return render(request, "registration/unlock_sent.html", status=202)


class LoginUnlockView(View):
    """GET the mailed link: spends it and gives this browser the unlock cookie, then the sign-in form."""

    def get(self, request, token: str):
        try:
            user = login_unlock_redeem(token=token, ip_address=client_ip(request))
        except ApplicationError as error:
            return render(request, "registration/unlock_refused.html", {"message": error.message},
                          status=error.status)
        response = redirect(f"{reverse('login')}?unlocked=1")
        login_unlock_cookie_set(response, user=user)
        return response
