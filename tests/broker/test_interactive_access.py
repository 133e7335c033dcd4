"""Interactive access through the broker (issue 29, docs/leasing.md "Interactive access"), end to end: a lease's
workload runs a small HTTP + WebSocket echo server on a simulated node (``agent.fleet``, the workload a real process
listening on the node's loopback); the broker's interactive proxy (``manage.py interactive_proxy``, its own process)
relays to it through the node agent's signed relay.

The owner's tenant gets the page and a WebSocket echo with its token or its portal session; another tenant's token is
404, none 401, a viewer 403; the workload never sees the broker's credentials; the agent's relay refuses an unsigned
request; a released lease's URL answers 409."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import aiohttp
import requests

from core import processes
from tests.factories import make_quota
from tests.support.api import Api
from tests.support.processes import free_port, test_database_url

# The workload: an aiohttp server on GPUB_LISTEN_HOST:PORT (the node's loopback, the host port the broker gave).
# GET /<path> answers what it saw (path, query, the headers that matter); /ws echoes every message back.
ECHO = """
import json, os
from aiohttp import web

async def page(request):
    if request.headers.get("Upgrade", "").lower() == "websocket":
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for message in ws:
            await ws.send_str("echo: " + message.data)
        return ws
    seen = {"path": request.path, "query": request.rel_url.raw_query_string, "method": request.method,
            "body": (await request.read()).decode(),
            "authorization": request.headers.get("Authorization"), "cookie": request.headers.get("Cookie"),
            "prefix": request.headers.get("X-Forwarded-Prefix"), "gpub": [k for k in request.headers if
                                                                          k.lower().startswith("x-gpub")]}
    response = web.json_response(seen)
    response.set_cookie("sessionid", "planted-by-the-workload")
    response.set_cookie("notebook", "kept")
    return response

app = web.Application()
app.router.add_route("*", "/{tail:.*}", page)
print("listening on", os.environ["GPUB_LISTEN_HOST"], os.environ["PORT"], flush=True)
web.run_app(app, host=os.environ["GPUB_LISTEN_HOST"], port=int(os.environ["PORT"]), print=None)
"""


def _proxy(settings) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "DATABASE_URL": test_database_url(), "SECRET_KEY": settings.SECRET_KEY,
           "LOG_LEVEL": "WARNING", "DATABASE_CONN_MAX_AGE": "0"}
    process = processes.start([sys.executable, "manage.py", "interactive_proxy", "--listen", f"127.0.0.1:{port}"],
                              env=env, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    processes.wait_http(url + "/healthz", process, timeout=60, step=0.2)
    return process, url


def _websocket(url: str, message: str, **headers) -> str | int:
    """The first answer to ``message`` on a WebSocket at ``url``, or the status that refused the upgrade."""
    async def talk():
        async with aiohttp.ClientSession() as session:
            try:
                async with session.ws_connect(url, headers=headers, timeout=aiohttp.ClientWSTimeout(ws_receive=10)) \
                        as ws:
                    await ws.send_str(message)
                    answer = await ws.receive(timeout=10)
                    return answer.data
            except aiohttp.WSServerHandshakeError as refused:
                return refused.status

    return asyncio.run(talk())


def test_interactive_access_page_and_websocket_for_the_owner_only(worker, workload_fleet, world, shared, settings,
                                                                  live_server, client):
    make_quota(world.project, "A100-80GB", deserved=1000, limit=2000, tenant_deserved=1000, tenant_limit=4000)
    proxy, site = _proxy(settings)
    settings.INTERACTIVE_PROXY_URL = site
    try:
        member = Api(live_server.url, world.tokens["member"])
        status, lease = member.call("POST", "/leases", {
            "project": "vision", "gpu": {"kind": "whole", "model": "A100-80GB"}, "duration_seconds": 600,
            "workload": {"command": [sys.executable, "-c", ECHO], "port": 8888}})
        assert status == 201, lease
        page = f"{site}/leases/{lease['id']}/port/"

        def running():
            _, detail = member.call("GET", f"/leases/{lease['id']}")
            if detail["state"] != "active" or (detail["workload"] or {}).get("state") != "running":
                return None
            _, log = member.call("GET", f"/leases/{lease['id']}/logs")
            return detail if "listening on" in log.get("data", "") else None

        detail = processes.wait_until(running, timeout=90, step=0.3, what="the echo server running")
        # the lease's access says where: the proxy's URL for this lease, HTTP and WebSocket
        interactive = detail["access"][0]["interactive"]
        assert interactive["url"] == page and interactive["websocket_url"] == "ws" + page[4:]
        assert interactive["port"] == 8888 and interactive["running"] is True
        # the workload was told to listen on the node's loopback, on the host port the broker gave
        spec_port = detail["workload"]["endpoint"].rsplit(":", 1)[1]
        _, log = member.call("GET", f"/leases/{lease['id']}/logs")
        assert f"listening on 127.0.0.1 {spec_port}" in log["data"]

        owner = {"Authorization": f"Bearer {world.tokens['member']}"}
        answer = requests.post(page + "notebooks/a%20b?x=1&y=%2F", data=b"hello", headers=owner, timeout=20)
        assert answer.status_code == 200, (
            answer.text, member.call("GET", f"/leases/{lease['id']}/logs?stream=stderr")[1].get("data"))
        seen = answer.json()
        # the path after /port and the query as sent; the body; the prefix to build links with
        assert seen["path"] == "/notebooks/a b" and seen["query"] == "x=1&y=%2F" and seen["method"] == "POST"
        assert seen["body"] == "hello" and seen["prefix"] == f"/leases/{lease['id']}/port"
        # the broker's credentials and the node's signature never reach the workload
        assert seen["authorization"] is None and seen["gpub"] == []
        # the workload may set its own cookies, never the broker's session cookie
        assert "notebook=kept" in answer.headers.get("Set-Cookie", "")
        assert "planted-by-the-workload" not in answer.headers.get("Set-Cookie", "")
        # the WebSocket, relayed both ways
        ws = "ws" + page[4:] + "ws"
        assert _websocket(ws, "ping", **owner) == "echo: ping"

        # another tenant: 404, as for every object of another tenant; no credentials: 401; a viewer: 403
        outsider = {"Authorization": f"Bearer {world.tokens['outsider']}"}
        refused = requests.get(page, headers=outsider, timeout=20)
        assert refused.status_code == 404 and refused.headers["Content-Type"].startswith("application/problem+json")
        assert refused.json()["field"] == "id"
        assert _websocket(ws, "ping", **outsider) == 404
        anonymous = requests.get(page, timeout=20)
        assert anonymous.status_code == 401 and anonymous.json()["code"] == "not_authenticated"
        assert "Bearer" in anonymous.headers["WWW-Authenticate"]
        assert _websocket(ws, "ping") == 401
        assert requests.get(page, headers={"Authorization": "Bearer gpub_nope_nope"}, timeout=20).status_code == 401
        viewer = requests.get(page, headers={"Authorization": f"Bearer {world.tokens['viewer']}"}, timeout=20)
        assert viewer.status_code == 403 and viewer.json()["code"] == "permission_denied"

        # the portal's session: the page and the WebSocket from the proxy's own origin; not the session cookie to
        # the workload, and not a WebSocket another site opens with the tenant's cookie
        client.force_login(world.member)
        cookies = {settings.SESSION_COOKIE_NAME: client.cookies[settings.SESSION_COOKIE_NAME].value,
                   "notebook": "kept"}
        by_session = requests.get(page, cookies=cookies, timeout=20)
        assert by_session.status_code == 200 and by_session.json()["cookie"] == "notebook=kept"
        cookie = "; ".join(f"{k}={v}" for k, v in cookies.items())
        assert _websocket(ws, "hi", Cookie=cookie, Origin=site) == "echo: hi"
        assert _websocket(ws, "hi", Cookie=cookie, Origin="http://evil.example") == 403

        # the node's relay answers only the broker's signature
        from broker.models import Workload

        workload = Workload.objects.select_related("node").get(lease_id=lease["id"])
        unsigned = requests.get(f"{workload.node.address}/v1/workloads/{workload.agent_workload_id}/port/",
                                timeout=20)
        assert unsigned.status_code == 401

        # released: the URL no longer reaches anything (409 naming the port), and access offers none
        assert member.call("DELETE", f"/leases/{lease['id']}")[0] == 202
        processes.wait_until(lambda: member.call("GET", f"/leases/{lease['id']}")[1]["state"] == "released",
                             timeout=60, what="the lease released")
        gone = requests.get(page, headers=owner, timeout=20)
        assert gone.status_code == 409 and gone.json()["field"] == "workload.port"
        assert member.call("GET", f"/leases/{lease['id']}")[1]["access"] == []
    finally:
        processes.stop(proxy, timeout=10)
