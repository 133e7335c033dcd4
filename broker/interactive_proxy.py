"""The interactive proxy: a lease's workload port at an authenticated broker URL, HTTP and WebSocket
(docs/leasing.md, "Interactive access"). ``manage.py interactive_proxy`` runs it: one aiohttp process beside the web
server (``infra/run.py`` starts it), so a notebook's long-lived WebSocket or a slow answer holds no gunicorn thread.

``/leases/<id>/port/<path>?<query>`` → the lease's node agent, signed with the node's secret,
``/v1/workloads/<agent workload id>/port/<path>?<query>`` → the workload's ``127.0.0.1:<host port>`` on its node
(``agent.server.workload_port``). Every request (each WebSocket at its upgrade) is authenticated as the API is:
``Authorization: Bearer <token>`` (``tenants.authentication.BearerTokenAuthentication``: revoked, expired, throttled
as there) or the portal's session cookie (Django's session and user, the session's chosen tenant). The lease is then
looked up through the tenant's own leases (``broker.selectors.lease_interactive_target``): none → 401, another
tenant's → 404, a viewer or read-only token → 403, a lease whose workload does not run → 409, all problem+json.
A session-authenticated request that changes something (not GET/HEAD/OPTIONS) or opens a WebSocket must come from
this proxy's own origin or one of ``CSRF_TRUSTED_ORIGINS`` (its ``Origin`` header), else 403: another site cannot
drive a tenant's notebook with the tenant's cookie.

The workload never sees the broker's credentials: ``Authorization`` and the broker's session and CSRF cookies are
taken off the request, and an answer may not set those cookies. It sees ``X-Forwarded-Prefix: /leases/<id>/port``
(an app that writes absolute links needs it as its base URL), ``X-Forwarded-For``, ``-Proto`` and ``-Host``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from urllib.parse import urlsplit

import aiohttp
from aiohttp import web

from agent import relay
from agent.protocol import sign

logger = logging.getLogger("broker.interactive_proxy")
MAX_BODY = 8 * 1024 * 1024  # the agent's relay limit (agent.server.RELAY_MAX_BODY)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SESSION_KEY = web.AppKey("session", object)
POOL_KEY = web.AppKey("pool", object)


class Refused(Exception):
    def __init__(self, status: int, code: str, title: str, detail: str, field: str | None = None,
                 headers: dict | None = None):
        super().__init__(detail)
        self.status, self.code, self.title, self.detail, self.field = status, code, title, detail, field
        self.headers = headers or {}


def problem(error: Refused) -> web.Response:
    from core.problems import problem_body

    body = problem_body(status=error.status, title=error.title, detail=error.detail, code=error.code,
                        field=error.field)
    return web.json_response(body, status=error.status, content_type="application/problem+json",
                             headers=error.headers)


def _session_complete(request) -> None:
    """The portal's middleware rules for a session, applied here (the relay does not pass through Django's
    middleware): one that needs a second factor and has not passed it, or one opened with a local password a
    tenant of the user's has since switched off, reaches no workload."""
    from django.contrib.auth import BACKEND_SESSION_KEY

    from tenants.otp import second_factor_enrolled, second_factor_passed, second_factor_required
    from tenants.sso import BACKEND_PATH, password_sign_in_blocker

    user = request.user
    if not second_factor_passed(request) and (second_factor_enrolled(user) or second_factor_required(user)):
        raise Refused(403, "second_factor_required", "Second factor required",
                      "This session has not passed the second factor: finish signing in to the portal, or use an "
                      "API token.")
    backend = request.session.get(BACKEND_SESSION_KEY)
    if backend and backend != BACKEND_PATH and not user.is_staff and password_sign_in_blocker(user) is not None:
        raise Refused(401, "not_authenticated", "Not authenticated",
                      "This tenant signs its members in through single sign-on; sign in again that way.",
                      headers={"WWW-Authenticate": 'Bearer realm="api"'})


def authorize(*, lease_id: int, authorization: str, cookies: dict[str, str], remote_addr: str) -> tuple[dict, bool]:
    """(the relay target, whether the session authenticated it) for one request, or ``Refused``. Runs in a worker
    thread (Django's ORM is synchronous); the database connection is closed when it is stale, as a request's is."""
    from django.conf import settings
    from django.contrib.auth import get_user
    from django.db import close_old_connections
    from django.http import HttpRequest
    from rest_framework import exceptions
    from rest_framework.request import Request

    from broker.selectors import lease_interactive_target
    from core.errors import ApplicationError
    from tenants.authentication import BearerTokenAuthentication
    from tenants.selectors import actor_for_request

    close_old_connections()
    try:
        request = HttpRequest()
        request.method = "GET"
        request.META["REMOTE_ADDR"] = remote_addr
        by_session = False
        if authorization:
            request.META["HTTP_AUTHORIZATION"] = authorization
            authenticator = BearerTokenAuthentication()
            try:
                found = authenticator.authenticate(Request(request))
            except exceptions.Throttled as error:
                raise Refused(429, "throttled", "Too many requests", str(error.detail),
                              headers={"Retry-After": str(int(error.wait or 1))}) from None
            except exceptions.AuthenticationFailed as error:
                raise Refused(401, "not_authenticated", "Not authenticated", str(error.detail),
                              headers={"WWW-Authenticate": authenticator.authenticate_header(request)}) from None
            if found is None:
                raise Refused(401, "not_authenticated", "Not authenticated", "Use Authorization: Bearer <token>.",
                              headers={"WWW-Authenticate": authenticator.authenticate_header(request)})
            request.user, request.auth = found
        else:
            from importlib import import_module

            store = import_module(settings.SESSION_ENGINE).SessionStore
            request.session = store(cookies.get(settings.SESSION_COOKIE_NAME))
            request.user = get_user(request)
            request.auth = None
            if not request.user.is_authenticated:
                raise Refused(401, "not_authenticated", "Not authenticated",
                              "Sign in to the portal, or send Authorization: Bearer <token>.",
                              headers={"WWW-Authenticate": 'Bearer realm="api"'})
            _session_complete(request)
            by_session = True
        actor = actor_for_request(request)
        if actor is None:
            raise Refused(403, "permission_denied", "Permission denied", "You belong to no tenant.")
        try:
            return lease_interactive_target(actor=actor, lease_id=lease_id), by_session
        except ApplicationError as error:
            raise Refused(error.status, error.code, error.title, error.message, error.field) from None
    finally:
        close_old_connections()


def _origin_allowed(request: web.Request) -> bool:
    from django.conf import settings

    origin = request.headers.get("Origin")
    if origin is None:  # not a browser's cross-origin request (browsers send Origin on these)
        return True
    own = f"{request.scheme}://{request.host}"
    return origin == own or origin in settings.CSRF_TRUSTED_ORIGINS


async def handle(request: web.Request) -> web.StreamResponse:
    from django.conf import settings

    lease_id = int(request.match_info["lease_id"])
    prefix = f"/leases/{lease_id}/port"
    raw_path = request.rel_url.raw_path
    tail = raw_path[len(prefix) + 1:] if raw_path.startswith(prefix + "/") else ""
    is_websocket = request.headers.get("Upgrade", "").lower() == "websocket"
    try:
        if request.content_length is not None and request.content_length > MAX_BODY:
            raise Refused(413, "too_large", "Request too large", f"bodies are limited to {MAX_BODY} bytes")
        loop = asyncio.get_running_loop()
        target, by_session = await loop.run_in_executor(request.app[POOL_KEY], lambda: authorize(
            lease_id=lease_id, authorization=request.headers.get("Authorization", ""),
            cookies=dict(request.cookies), remote_addr=request.remote or ""))
        if by_session and (is_websocket or request.method not in SAFE_METHODS) and not _origin_allowed(request):
            raise Refused(403, "bad_origin", "Permission denied",
                          f"a request from {request.headers.get('Origin')!r} may not use the portal's session here",
                          field="Origin")
        body = await request.read()
        if len(body) > MAX_BODY:
            raise Refused(413, "too_large", "Request too large", f"bodies are limited to {MAX_BODY} bytes")
    except Refused as error:
        return problem(error)

    agent = target["agent_url"].rstrip("/")
    agent_prefix = urlsplit(agent).path
    path = f"/v1/workloads/{target['agent_workload_id']}/port/{tail}"
    query = request.rel_url.raw_query_string
    broker_cookies = frozenset({settings.SESSION_COOKIE_NAME, settings.CSRF_COOKIE_NAME})
    headers = relay.relay_headers(request.headers, drop=frozenset({"authorization", "cookie"}))
    if request.headers.get("Cookie"):
        kept = relay.cookie_header_without(request.headers["Cookie"], broker_cookies)
        if kept:
            headers["Cookie"] = kept
    forwarded_for = request.headers.get("X-Forwarded-For")
    headers.update({
        "X-Forwarded-Prefix": prefix, "X-Forwarded-Proto": request.scheme, "X-Forwarded-Host": request.host,
        "X-Forwarded-For": f"{forwarded_for}, {request.remote}" if forwarded_for else (request.remote or "")})
    headers.update(sign(target["secret"], target["node_id"], request.method, agent_prefix + path, body, query=query))
    url = agent + path + (f"?{query}" if query else "")
    session = request.app[SESSION_KEY]
    try:
        if is_websocket:
            return await relay.relay_websocket(request, session, "ws" + url[len("http"):], headers,
                                               max_msg_size=MAX_BODY)
        return await relay.relay_http(request, session, url, headers, body, drop_set_cookies=broker_cookies)
    except aiohttp.WSServerHandshakeError as error:
        return problem(Refused(502 if error.status >= 500 or error.status == 401 else error.status, "bad_gateway",
                               "The node refused the connection",
                               f"the node's agent answered {error.status} to the WebSocket: {error.message}",
                               field="workload.port"))
    except (aiohttp.ClientError, OSError) as error:
        logger.warning("lease %s: node %s does not answer: %s", lease_id, target["node_id"], error)
        return problem(Refused(502, "bad_gateway", "The node does not answer",
                               f"the lease's node {target['node_id']} does not answer: {error}",
                               field="workload.port"))


async def healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


def proxy_app(*, threads: int = 8) -> web.Application:
    """The proxy's aiohttp application (Django must be set up)."""
    app = web.Application(client_max_size=MAX_BODY + 1024)
    app.router.add_get("/healthz", healthz)
    app.router.add_route("*", r"/leases/{lease_id:\d{1,18}}/port{tail:(/.*)?}", handle)

    async def start(app_):
        app_[SESSION_KEY] = relay.client_session()
        app_[POOL_KEY] = concurrent.futures.ThreadPoolExecutor(max_workers=threads,
                                                               thread_name_prefix="interactive-auth")

    async def stop(app_):
        await app_[SESSION_KEY].close()
        app_[POOL_KEY].shutdown(wait=False)

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return app
