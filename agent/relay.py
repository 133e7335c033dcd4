"""Relaying HTTP and WebSocket to a workload's port, shared by the node agent (``agent.server.workload_port``: broker
→ node loopback) and the broker's interactive proxy (``broker.interactive_proxy``: tenant → agent). aiohttp only.

Hop-by-hop headers (RFC 9110 §7.6.1) stay on their hop; the broker's signature headers (``X-Gpub-*``) never reach
the workload; bodies are passed as bytes (compressed answers stay compressed: the client session is made with
``auto_decompress=False``); a WebSocket is piped message by message both ways until either side closes.
"""

from __future__ import annotations

import asyncio
from http.cookies import SimpleCookie

import aiohttp
from aiohttp import web

HOP_HEADERS = frozenset({"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te", "trailer",
                         "transfer-encoding", "upgrade", "host", "content-length", "sec-websocket-key",
                         "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-accept",
                         "sec-websocket-protocol"})
CHUNK = 64 * 1024


def client_session() -> aiohttp.ClientSession:
    """A session for relaying: no decompression, no overall timeout (a long answer streams), 5 s to connect."""
    return aiohttp.ClientSession(auto_decompress=False, cookie_jar=aiohttp.DummyCookieJar(),
                                 timeout=aiohttp.ClientTimeout(total=None, connect=5, sock_read=None))


def relay_headers(headers, *, drop: frozenset[str] = frozenset()) -> dict[str, str]:
    """The request headers to pass on: without hop-by-hop ones, the signature's (``X-Gpub-*``) and ``drop``."""
    out: dict[str, str] = {}
    for key, value in headers.items():
        lower = key.lower()
        if lower in HOP_HEADERS or lower.startswith("x-gpub-") or lower in drop:
            continue
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def cookie_header_without(value: str, names: frozenset[str]) -> str:
    """A ``Cookie`` header without the named cookies (the broker's session and CSRF cookies stay with the broker)."""
    kept = []
    for part in value.split(";"):
        name = part.split("=", 1)[0].strip()
        if name and name not in names:
            kept.append(part.strip())
    return "; ".join(kept)


def _sets_cookie_named(value: str, names: frozenset[str]) -> bool:
    try:
        cookie = SimpleCookie(value)
    except Exception:  # noqa: BLE001 - an unparsable Set-Cookie is not passed on either
        return True
    return any(name in names for name in cookie)


async def relay_http(request: web.Request, session: aiohttp.ClientSession, url: str, headers: dict, body: bytes,
                     *, drop_set_cookies: frozenset[str] = frozenset()) -> web.StreamResponse:
    """Send one request to ``url`` (already encoded) and stream its answer back. ``drop_set_cookies``: cookie names
    the answer may not set (a workload may not overwrite the broker's session cookie). Raises ``aiohttp.ClientError``
    or ``OSError`` when ``url`` does not answer."""
    from yarl import URL

    upstream = await session.request(request.method, URL(url, encoded=True), headers=headers, data=body,
                                     allow_redirects=False)
    async with upstream:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        for key, value in upstream.headers.items():
            if key.lower() in HOP_HEADERS:
                continue
            if key.lower() == "set-cookie" and drop_set_cookies and _sets_cookie_named(value, drop_set_cookies):
                continue
            response.headers.add(key, value)
        if upstream.headers.get("Content-Length") is not None:
            response.content_length = int(upstream.headers["Content-Length"])
        await response.prepare(request)
        async for chunk in upstream.content.iter_chunked(CHUNK):
            await response.write(chunk)
        await response.write_eof()
    return response


async def relay_websocket(request: web.Request, session: aiohttp.ClientSession, url: str, headers: dict, *,
                          max_msg_size: int) -> web.StreamResponse:
    """Open a WebSocket to ``url`` (ws://…, encoded), then accept the caller's and pipe both ways, message by
    message, until either closes. Raises ``aiohttp.ClientError`` (``WSServerHandshakeError`` with the upstream's
    status) or ``OSError`` before accepting the caller's when ``url`` refuses."""
    from yarl import URL

    protocols = [p.strip() for p in request.headers.get("Sec-WebSocket-Protocol", "").split(",") if p.strip()]
    upstream = await session.ws_connect(URL(url, encoded=True), headers=headers, protocols=protocols,
                                        autoping=True, max_msg_size=max_msg_size)
    downstream = web.WebSocketResponse(protocols=[upstream.protocol] if upstream.protocol else (), autoping=True,
                                       max_msg_size=max_msg_size)
    await downstream.prepare(request)

    async def pump(source, sink) -> None:
        async for message in source:
            if message.type == aiohttp.WSMsgType.TEXT:
                await sink.send_str(message.data)
            elif message.type == aiohttp.WSMsgType.BINARY:
                await sink.send_bytes(message.data)
            else:  # CLOSE, CLOSING, CLOSED, ERROR
                break
        await sink.close()

    async with upstream:
        _done, pending = await asyncio.wait([asyncio.ensure_future(pump(downstream, upstream)),
                                             asyncio.ensure_future(pump(upstream, downstream))],
                                            return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    await downstream.close()
    return downstream
