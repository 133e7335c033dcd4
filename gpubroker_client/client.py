"""``Client``: one typed method per API operation it covers, each declaring its route with ``@operation``
(``tests/client/test_sdk.py`` checks every declared route and method against the server's OpenAPI document).
Answers are the server's JSON (dicts, as the document describes them); errors are ``ApiError``."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

import requests

from gpubroker_client.config import Config, load_config

F = TypeVar("F", bound=Callable[..., Any])
JSON = dict[str, Any]
USER_AGENT = "gpubroker-client/0.1"


def operation(method: str, path: str) -> Callable[[F], F]:
    """Declare the route a method calls (``{name}`` for path parameters), for the schema check and the docs."""

    def mark(function: F) -> F:
        function.route = (method.upper(), path)  # type: ignore[attr-defined]
        return function

    return mark


def operations() -> dict[str, tuple[str, str]]:
    """Every ``Client`` method name → (HTTP method, path template) it calls."""
    return {name: member.route for name, member in vars(Client).items() if hasattr(member, "route")}


class ApiError(Exception):
    """An error answer: the problem+json fields (``status``, ``code``, ``detail``, ``field``, ``errors``) and the
    whole ``body``. Without a problem+json body (a proxy's page), ``code`` is ``http_<status>``."""

    def __init__(self, status: int, body: dict | None, text: str = ""):
        body = body if isinstance(body, dict) else {}
        self.status = status
        self.body = body
        self.code: str = body.get("code") or f"http_{status}"
        self.title: str = body.get("title", "")
        self.detail: str = body.get("detail") or text[:200] or f"HTTP {status}"
        self.field: str | None = body.get("field")
        self.errors: list[dict] = body.get("errors") or []
        self.retry_after: str | None = None
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f" ({self.field})" if self.field else ""
        return f"{self.status} {self.code}{where}: {self.detail}"


@dataclass
class Page:
    """One page of a list: ``count`` in all, ``results`` here, ``next`` the next page's URL (None at the end)."""

    count: int
    results: list[JSON]
    next: str | None = None
    previous: str | None = None
    extra: JSON = field(default_factory=dict)


def _path(template: str, **values: Any) -> str:
    return template.format(**{name: quote(str(value), safe="") for name, value in values.items()})


def _clean(params: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in params.items() if value is not None}


class Client:
    """The broker's REST API for one token. ``url`` is the server's base (``http://host:8000``)."""

    def __init__(self, url: str, token: str, *, timeout: float = 30.0, session: requests.Session | None = None):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self._token = token
        self._session = session or requests.Session()
        self._session.headers.update({"Authorization": f"Bearer {token}", "Accept": "application/json",
                                      "User-Agent": USER_AGENT})

    def __repr__(self) -> str:  # never the token
        return f"Client(url={self.url!r})"

    @classmethod
    def from_config(cls, config: Config | None = None, **kwargs: Any) -> Client:
        config = config or load_config()
        return cls(config.url, config.token, **kwargs)

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- transport ------------------------------------------------------------------------------------------
    def request(self, method: str, path: str, *, params: dict | None = None, body: Any = None,
                headers: dict | None = None, timeout: float | None = None) -> Any:
        """Send one request; the decoded JSON answer (None for 204), or ``ApiError``."""
        url = path if path.startswith(("http://", "https://")) else self.url + path
        response = self._session.request(method, url, params=_clean(params or {}),
                                         data=None if body is None else json.dumps(body),
                                         headers={**({"Content-Type": "application/json"} if body is not None
                                                     else {}), **(headers or {})},
                                         timeout=timeout or self.timeout)
        if response.status_code >= 400:
            try:
                problem = response.json()
            except ValueError:
                problem = None
            error = ApiError(response.status_code, problem, response.text)
            error.retry_after = response.headers.get("Retry-After")
            raise error
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def _page(self, path: str, params: dict) -> Page:
        answer = self.request("GET", path, params=params)
        extra = {k: v for k, v in answer.items() if k not in ("count", "results", "next", "previous")}
        return Page(count=answer["count"], results=answer["results"], next=answer.get("next"),
                    previous=answer.get("previous"), extra=extra)

    def iterate(self, page: Page) -> Iterator[JSON]:
        """Every result from ``page`` on, following ``next`` links."""
        while True:
            yield from page.results
            if not page.next:
                return
            answer = self.request("GET", page.next)
            page = Page(count=answer["count"], results=answer["results"], next=answer.get("next"),
                        previous=answer.get("previous"))

    # -- leases ---------------------------------------------------------------------------------------------
    @operation("get", "/api/v1/leases")
    def lease_list(self, *, state: list[str] | None = None, project: str | None = None, limit: int | None = None,
                   offset: int | None = None) -> Page:
        """The tenant's leases, newest first (``state``: only these states)."""
        return self._page("/api/v1/leases", {"state": ",".join(state) if state else None, "project": project,
                                             "limit": limit, "offset": offset})

    @operation("post", "/api/v1/leases")
    def lease_request(self, *, project: str, gpu: dict, duration_seconds: int | None = None,
                      workload_class: str | None = None, priority: int | None = None, workload: dict | None = None,
                      idempotency_key: str | None = None, labels: dict[str, str] | None = None) -> JSON:
        """Request GPU capacity; the lease (queued, or its existing one when ``idempotency_key`` repeats).
        ``labels``: cost allocation labels, keys the tenant allows (``GET /api/v1/label-keys``)."""
        body = _clean({"project": project, "gpu": gpu, "duration_seconds": duration_seconds,
                       "workload_class": workload_class, "priority": priority, "workload": workload,
                       "labels": labels or None})
        return self.request("POST", "/api/v1/leases", body=body,
                            headers={"Idempotency-Key": idempotency_key} if idempotency_key else None)

    @operation("get", "/api/v1/leases/{id}")
    def lease_get(self, lease_id: int) -> JSON:
        """A lease with its devices and events."""
        return self.request("GET", _path("/api/v1/leases/{id}", id=lease_id))

    @operation("delete", "/api/v1/leases/{id}")
    def lease_release(self, lease_id: int) -> JSON:
        """Give a lease back (idempotent); the lease as it is now."""
        return self.request("DELETE", _path("/api/v1/leases/{id}", id=lease_id))

    @operation("post", "/api/v1/leases/{id}/renew")
    def lease_renew(self, lease_id: int, *, duration_seconds: int) -> JSON:
        return self.request("POST", _path("/api/v1/leases/{id}/renew", id=lease_id),
                            body={"duration_seconds": duration_seconds})

    @operation("get", "/api/v1/leases/{id}/logs")
    def lease_logs(self, lease_id: int, *, stream: str | None = None, offset: int | None = None,
                   tail: int | None = None, limit: int | None = None, follow: int | None = None,
                   placement: int | None = None) -> JSON:
        """A range of the lease's workload log (``data``, ``next_offset``, ``state`` …)."""
        timeout = self.timeout + (follow or 0)
        return self.request("GET", _path("/api/v1/leases/{id}/logs", id=lease_id), timeout=timeout,
                            params={"stream": stream, "offset": offset, "tail": tail, "limit": limit,
                                    "follow": follow, "placement": placement})

    # -- prices and usage -----------------------------------------------------------------------------------
    @operation("post", "/api/v1/quotes")
    def quote(self, *, project: str, gpu: dict, duration_seconds: int | None = None,
              workload_class: str | None = None, priority: int | None = None) -> JSON:
        """What a lease request would get and cost now (nothing is written)."""
        return self.request("POST", "/api/v1/quotes", body=_clean({
            "project": project, "gpu": gpu, "duration_seconds": duration_seconds,
            "workload_class": workload_class, "priority": priority}))

    @operation("get", "/api/v1/usage")
    def usage(self, *, start: str | None = None, end: str | None = None, group_by: str | None = None) -> JSON:
        """Metered GPU usage and its cost (``start``/``end``: ISO 8601 dates or times; ``group_by``: project,
        model or day)."""
        return self.request("GET", "/api/v1/usage", params={"from": start, "to": end, "group_by": group_by})

    # -- the caller's tenant --------------------------------------------------------------------------------
    @operation("get", "/api/v1/tenant")
    def tenant(self) -> JSON:
        """The token's tenant and the caller's role in it."""
        return self.request("GET", "/api/v1/tenant")

    @operation("get", "/api/v1/projects")
    def project_list(self, *, limit: int | None = None, offset: int | None = None) -> Page:
        return self._page("/api/v1/projects", {"limit": limit, "offset": offset})

    # -- platform staff: tenants, quotas, projects, SLO contracts -------------------------------------------
    @operation("get", "/api/v1/tenants")
    def staff_tenant_list(self, *, limit: int | None = None, offset: int | None = None) -> Page:
        return self._page("/api/v1/tenants", {"limit": limit, "offset": offset})

    @operation("post", "/api/v1/tenants")
    def staff_tenant_create(self, *, slug: str, name: str, billing_email: str, currency: str | None = None) -> JSON:
        return self.request("POST", "/api/v1/tenants", body=_clean(
            {"slug": slug, "name": name, "billing_email": billing_email, "currency": currency}))

    @operation("get", "/api/v1/tenants/{slug}")
    def staff_tenant_get(self, slug: str) -> JSON:
        return self.request("GET", _path("/api/v1/tenants/{slug}", slug=slug))

    @operation("patch", "/api/v1/tenants/{slug}")
    def staff_tenant_update(self, slug: str, *, name: str | None = None, billing_email: str | None = None) -> JSON:
        return self.request("PATCH", _path("/api/v1/tenants/{slug}", slug=slug),
                            body=_clean({"name": name, "billing_email": billing_email}))

    @operation("patch", "/api/v1/tenants/{slug}")
    def staff_tenant_cohort_set(self, slug: str, cohort: str | None) -> JSON:
        """Put the tenant in cohort ``cohort`` (its name), or take it out of its cohort (None)."""
        return self.request("PATCH", _path("/api/v1/tenants/{slug}", slug=slug), body={"cohort": cohort})

    @operation("get", "/api/v1/cohorts")
    def staff_cohort_list(self, *, limit: int | None = None, offset: int | None = None) -> Page:
        return self._page("/api/v1/cohorts", {"limit": limit, "offset": offset})

    @operation("post", "/api/v1/cohorts")
    def staff_cohort_create(self, *, name: str, description: str = "") -> JSON:
        return self.request("POST", "/api/v1/cohorts", body={"name": name, "description": description})

    @operation("put", "/api/v1/tenants/{slug}/status")
    def staff_tenant_set_status(self, slug: str, *, status: str, reason: str = "") -> JSON:
        """``status``: suspended or active."""
        return self.request("PUT", _path("/api/v1/tenants/{slug}/status", slug=slug),
                            body={"status": status, "reason": reason})

    @operation("get", "/api/v1/tenants/{slug}/quotas")
    def staff_quotas(self, slug: str) -> JSON:
        return self.request("GET", _path("/api/v1/tenants/{slug}/quotas", slug=slug))

    @operation("put", "/api/v1/tenants/{slug}/quotas/{tier}")
    def staff_tenant_quota_set(self, slug: str, tier: str, *, deserved_gpu_milli: int, limit_gpu_milli: int,
                               **cohort_limits: int | None) -> JSON:
        """``cohort_limits``: ``lending_limit_gpu_milli`` / ``borrowing_limit_gpu_milli`` (None: no limit; left
        out: kept)."""
        return self.request("PUT", _path("/api/v1/tenants/{slug}/quotas/{tier}", slug=slug, tier=tier),
                            body={"deserved_gpu_milli": deserved_gpu_milli, "limit_gpu_milli": limit_gpu_milli,
                                  **cohort_limits})

    @operation("get", "/api/v1/tenants/{slug}/projects")
    def staff_project_list(self, slug: str, *, limit: int | None = None, offset: int | None = None) -> Page:
        return self._page(_path("/api/v1/tenants/{slug}/projects", slug=slug), {"limit": limit, "offset": offset})

    @operation("post", "/api/v1/tenants/{slug}/projects")
    def staff_project_create(self, slug: str, *, project: str, name: str, description: str = "") -> JSON:
        return self.request("POST", _path("/api/v1/tenants/{slug}/projects", slug=slug),
                            body={"slug": project, "name": name, "description": description})

    @operation("get", "/api/v1/tenants/{slug}/projects/{project}")
    def staff_project_get(self, slug: str, project: str) -> JSON:
        return self.request("GET", _path("/api/v1/tenants/{slug}/projects/{project}", slug=slug, project=project))

    @operation("patch", "/api/v1/tenants/{slug}/projects/{project}")
    def staff_project_update(self, slug: str, project: str, *, name: str | None = None,
                             description: str | None = None, pools: list[str] | None = None) -> JSON:
        return self.request("PATCH", _path("/api/v1/tenants/{slug}/projects/{project}", slug=slug, project=project),
                            body=_clean({"name": name, "description": description, "pools": pools}))

    @operation("put", "/api/v1/tenants/{slug}/projects/{project}/status")
    def staff_project_set_status(self, slug: str, project: str, *, status: str, reason: str = "") -> JSON:
        return self.request("PUT", _path("/api/v1/tenants/{slug}/projects/{project}/status", slug=slug,
                                         project=project), body={"status": status, "reason": reason})

    @operation("put", "/api/v1/tenants/{slug}/projects/{project}/quotas/{tier}")
    def staff_project_quota_set(self, slug: str, project: str, tier: str, *, deserved_gpu_milli: int,
                                limit_gpu_milli: int, over_quota_weight: int | None = None) -> JSON:
        return self.request("PUT", _path("/api/v1/tenants/{slug}/projects/{project}/quotas/{tier}", slug=slug,
                                         project=project, tier=tier),
                            body=_clean({"deserved_gpu_milli": deserved_gpu_milli, "limit_gpu_milli": limit_gpu_milli,
                                         "over_quota_weight": over_quota_weight}))

    @operation("get", "/api/v1/tenants/{slug}/slo-contracts")
    def staff_slo_contract_list(self, slug: str, *, limit: int | None = None, offset: int | None = None) -> Page:
        return self._page(_path("/api/v1/tenants/{slug}/slo-contracts", slug=slug), {"limit": limit, "offset": offset})

    @operation("post", "/api/v1/tenants/{slug}/slo-contracts")
    def staff_slo_contract_create(self, slug: str, **contract: Any) -> JSON:
        """``contract``: name, effective_from, effective_to, time_to_gpu_p95_seconds, availability_target_pct,
        preemption_notice_seconds, max_credit_pct, credit_steps (docs/tenancy.md, "Staff API")."""
        return self.request("POST", _path("/api/v1/tenants/{slug}/slo-contracts", slug=slug), body=contract)

    @operation("put", "/api/v1/tenants/{slug}/slo-contracts/{id}")
    def staff_slo_contract_update(self, slug: str, contract_id: int, **contract: Any) -> JSON:
        return self.request("PUT", _path("/api/v1/tenants/{slug}/slo-contracts/{id}", slug=slug, id=contract_id),
                            body=contract)
